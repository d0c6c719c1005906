"""FedTP one-shot aggregation at scale: DPMean vs Flower's FedAvg vs plain numpy.

One go, one process tree: for each N, ``fedsim run experiment=fedtp_aggregate`` through Flower's
Ray simulation with N SuperNodes (real Topical-Chat conversations, resampled to N) for DPMean and
for FedAvg over the same client vectors, then the same aggregation in numpy (the floor). Prints
wall seconds, strategy seconds and ms per client-round, and the ratios within each N.

    .venv/bin/python bench/fedtp_scale.py            # N = 100, 1000, 8628
    .venv/bin/python bench/fedtp_scale.py --n 100    # quick
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedsim.data import resolve_data_root
from fedsim.privacy import gaussian_mean
from tasks.topical_chat.dataset import SPLITS, load_conversations, load_topics, local_preference

FEDSIM = str(Path(sys.executable).parent / "fedsim")
STRATEGIES = ("dp_mean", "fedavg")


def per_split(n: int, total: int) -> int | None:
    """Conversations kept per split so that N nodes get one each (None: all, resampled)."""
    return None if n >= total else -(-n // len(SPLITS))


def flower(n: int, keep: int | None, strategy: str, out: Path) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([FEDSIM, "run", "experiment=fedtp_aggregate", f"strategy={strategy}",
                           f"hardware.num_supernodes={n}", f"task.max_per_split={keep or 'null'}",
                           f"results_dir={out}"],
                          capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{strategy} N={n} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    res = json.loads((out / "results.json").read_text())
    return {"wall_s": wall, "strategy_s": res["strategy_seconds"],
            "ms_per_client_round": res["ms_per_client_round"]}


def numpy_floor(vectors: np.ndarray, repeats: int = 20) -> dict:
    times = {}
    for name, fn in (("dp_mean", lambda: gaussian_mean(vectors, 1.0, 1.0,
                                                       np.random.default_rng(0), True)),
                     ("fedavg", lambda: vectors.mean(axis=0))):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        times[name] = (time.perf_counter() - t0) / repeats
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000, 8628])
    args = parser.parse_args()
    root = str(resolve_data_root())
    dim = len(load_topics(root))
    total = len(load_conversations(root, SPLITS))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.n:
            keep = per_split(n, total)
            convs = load_conversations(root, SPLITS, keep)
            base = np.stack([local_preference(c, dim) for c in convs])
            vectors = base[np.arange(n) % len(base)]  # the same resampling as the partitioner
            run = {s: flower(n, keep, s, Path(tmp) / f"{s}-{n}") for s in STRATEGIES}
            floor = numpy_floor(vectors)
            for s in STRATEGIES:
                rows.append({"N": n, "strategy": s, **run[s], "numpy_ms": 1000 * floor[s]})
            ratio = run["dp_mean"]["strategy_s"] / run["fedavg"]["strategy_s"]
            print(f"N={n}: DPMean/FedAvg strategy-time ratio {ratio:.3f}, wall ratio "
                  f"{run['dp_mean']['wall_s'] / run['fedavg']['wall_s']:.3f}; Flower DPMean / "
                  f"numpy floor {run['dp_mean']['strategy_s'] / floor['dp_mean']:.0f}x", flush=True)
    print("\n| N | strategy | wall s | strategy s | ms / client-round | numpy floor ms |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['N']} | {r['strategy']} | {r['wall_s']:.1f} | {r['strategy_s']:.1f} | "
              f"{r['ms_per_client_round']:.2f} | {r['numpy_ms']:.3f} |")


if __name__ == "__main__":
    main()
