"""FedTP one-shot aggregation at scale: one SuperNode per client vs many clients per SuperNode.

One go, one process tree at a time: for each N, ``fedsim run experiment=fedtp_aggregate``
through Flower's Ray simulation (real Topical-Chat conversations, resampled to N clients) with

- one SuperNode per client, for DPMean and for Flower's FedAvg over the same client vectors;
- N logical clients over K SuperNodes (``hardware.clients_per_supernode``), DPMean;

then the same aggregation in numpy (the floor). DPMean runs at sigma = 0, so every layout must
release the same prior (client-level clipping is per logical client either way). Prints wall
seconds, strategy seconds, ms per client-round, peak memory of the run's whole process tree,
the ratios to one SuperNode per client within the same N, and the largest difference between
the released priors.

    .venv/bin/python bench/fedtp_scale.py                       # N = 1000, 8628; K = 2, 8, 64
    .venv/bin/python bench/fedtp_scale.py --n 100 --k 2 8       # quick
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
from process_tree import PeakMemory

from fedsim.config.data import resolve_data_root
from fedsim.privacy.dp import gaussian_mean
from fedsim_tasks.topical_chat.dataset import (
    SPLITS,
    load_conversations,
    load_topics,
    local_preference,
)

FEDSIM = str(Path(sys.executable).parent / "fedsim")


def per_split(n: int, total: int) -> int | None:
    """Conversations kept per split so that N clients get one each (None: all, resampled)."""
    return None if n >= total else -(-n // len(SPLITS))


def flower(
    n: int, keep: int | None, strategy: str, per_node: int, supernodes: int, out: Path
) -> dict:
    cmd = [
        FEDSIM,
        "run",
        "experiment=fedtp_aggregate",
        f"strategy={strategy}",
        "strategy.noise_multiplier=0" if strategy == "dp_mean" else "seed=0",
        f"hardware.num_clients={n}",
        f"hardware.num_supernodes={supernodes}",
        f"hardware.clients_per_supernode={per_node}",
        f"task.max_per_split={keep or 'null'}",
        f"results_dir={out}",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    memory = PeakMemory(proc.pid)
    log, _ = proc.communicate()
    wall, peak = time.monotonic() - t0, memory.stop()
    if proc.returncode != 0:
        raise SystemExit(f"{strategy} N={n} K={supernodes} failed:\n{log[-4000:]}")
    res = json.loads((out / "results.json").read_text())
    return {
        "wall_s": wall,
        "strategy_s": res["strategy_seconds"],
        "peak_gb": peak,
        "ms_per_client_round": res["ms_per_client_round"],
        "supernodes": res["supernodes"],
        "released": np.asarray(res["released"]),
    }


def numpy_floor(vectors: np.ndarray, repeats: int = 20) -> dict:
    times = {}
    for name, fn in (
        ("dp_mean", lambda: gaussian_mean(vectors, 1.0, 0.0, np.random.default_rng(0), True)),
        ("fedavg", lambda: vectors.mean(axis=0)),
    ):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        times[name] = (time.perf_counter() - t0) / repeats
    return times


def layouts(n: int, ks: list[int]) -> list[tuple[str, int, int]]:
    """(strategy, clients per SuperNode, SuperNodes): one per client first (the baseline)."""
    rows = [("dp_mean", 1, n), ("fedavg", 1, n)]
    for k in sorted(set(ks), reverse=True):
        if k < n:
            rows.append(("dp_mean", -(-n // k), k))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[1000, 8628])
    parser.add_argument("--k", type=int, nargs="+", default=[2, 8, 64], help="SuperNodes (sharded)")
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
            floor = numpy_floor(base[np.arange(n) % len(base)])  # the partitioner's resampling
            baseline = None
            for strategy, per_node, k in layouts(n, args.k):
                r = flower(n, keep, strategy, per_node, k, Path(tmp) / f"{strategy}-{n}-{k}")
                baseline = baseline or r
                diff = (
                    float(np.abs(r["released"] - baseline["released"]).max())
                    if strategy == "dp_mean"
                    else None
                )
                rows.append(
                    {
                        "N": n,
                        "strategy": strategy,
                        "per_node": per_node,
                        **r,
                        "numpy_ms": 1000 * floor[strategy],
                        "diff": diff,
                        "wall_x": baseline["wall_s"] / r["wall_s"],
                        "strategy_x": baseline["strategy_s"] / r["strategy_s"],
                    }
                )
                print(
                    f"N={n} {strategy} K={r['supernodes']} ({per_node}/node): wall {r['wall_s']:.1f} s, "
                    f"strategy {r['strategy_s']:.2f} s ({rows[-1]['strategy_x']:.1f}x), peak "
                    f"{r['peak_gb']:.2f} GB, prior max|diff| {diff}",
                    flush=True,
                )
    print(
        "\n| N | strategy | SuperNodes | clients / SuperNode | wall s | strategy s | ms / client-round | "
        "peak GB (process tree) | speed-up vs 1 per client (wall / strategy) | max abs diff of the prior "
        "| numpy floor ms |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        diff = "" if r["diff"] is None else f"{r['diff']:.1e}"
        print(
            f"| {r['N']} | {r['strategy']} | {r['supernodes']} | {r['per_node']} | {r['wall_s']:.1f} | "
            f"{r['strategy_s']:.2f} | {r['ms_per_client_round']:.3f} | {r['peak_gb']:.2f} | "
            f"{r['wall_x']:.1f}x / {r['strategy_x']:.1f}x | {diff} | {r['numpy_ms']:.3f} |"
        )


if __name__ == "__main__":
    main()
