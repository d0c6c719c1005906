"""Seconds of each exchange in a deployment against the same exchange in the Ray simulation.

One run: FedTP (the deployment tests' small slice) and a small FedE4RAG (LoRA, HE in one trip;
the network-namespace test's slice), each through the Ray simulation and through
``hardware=deploy_local`` (2 SuperNodes, TLS + node authentication). The seconds are the
Messenger's own per-exchange records (``results.json`` ``communication``: push to last reply),
not the wall time of the whole command, so start-up costs stay out. Prints, per exchange, the
simulation's seconds, each deployment variant's, their ratio and difference, and the sum over
the exchanges after ``discover``; then, per deployment, where each exchange's seconds went
(``fedsim/runtime/exchange_trace.py``: dispatch, process start, set-up, work, reply; the mean over the
exchange's messages).

    nice -n 19 .venv/bin/python bench/deploy_exchange.py [--only fedtp|lora] \
        [--variant 'label=override ...' ...]

A ``--variant`` adds a deployment with more overrides (e.g.
``cold=hardware.clientapp_workers=0 hardware.clientapp_preload=null``, Flower's cold ClientApp
process per message), so that before and after are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedsim.runtime import exchange_trace

FEDSIM = str(Path(sys.executable).parent / "fedsim")
FEDTP = ["task.max_per_split=2", "protocol.dp_seeds=2", "protocol.bootstrap=200"]
LORA = [
    "experiment=fede4rag_paper",
    "task.companies=[AES Corporation,Boeing]",
    "task.pages_per_client=30",
    "task.n_valid=4",
    "task.n_test=6",
    "task.corpus_pages_per_doc=8",
    "task.embedding_cache=null",
    "num_rounds=1",
    "protocol.local_steps=2",
    "protocol.batch_size=4",
    "protocol.eval_pages_per_message=64",
    "~protocol.methods",
    "+protocol.methods={fede4rag: {run: fedsim_experiments.fede4rag.protocol.federated, kd_weight: 1.0, he: true}}",
]
TASKS = {"fedtp": FEDTP, "lora": LORA}


def exchanges(task: list[str], hardware: list[str], out: Path) -> tuple[dict, float, dict]:
    """``{(phase, round): seconds}`` of one run, the run's wall seconds, and where each
    exchange's seconds went (``{(phase, round): {stage: s}}``)."""
    keys = [f"task.he.key_dir={out / 'keys'}"] if task is LORA else []
    trace = out / "trace"
    trace.mkdir(parents=True)
    start = time.monotonic()
    subprocess.run(
        [
            FEDSIM,
            "run",
            *task,
            *keys,
            *hardware,
            "hardware.num_supernodes=2",
            f"client_state.dir={out / 'state'}",
            f"results_dir={out / 'results'}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env={**os.environ, exchange_trace.TRACE_ENV: str(trace)},
    )
    wall = time.monotonic() - start
    traffic = json.loads((out / "results" / "results.json").read_text())["communication"]
    stages = {
        (phase, str(r)): s
        for (phase, r), s in exchange_trace.breakdown(exchange_trace.read(trace)).items()
    }
    return (
        {
            (phase, r): row["seconds"]
            for phase, rounds in traffic.items()
            for r, row in rounds.items()
            if isinstance(row, dict) and "seconds" in row
        },
        wall,
        stages,
    )


def print_stages(label: str, seconds: dict, stages: dict) -> None:
    """One deployment's exchanges split into the trace's stages."""
    names = list(exchange_trace.STAGES)
    print(f"\n{label}: where each exchange's seconds went (mean over its messages)")
    print("| exchange | round | s | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for (phase, rnd), total in seconds.items():
        split = stages.get((phase, rnd))
        cells = [f"{split[n]:.2f}" for n in names] if split else ["-"] * len(names)
        print(f"| {phase} | {rnd} | {total:.2f} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(TASKS))
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="'label=override ...': one more deployment with these overrides",
    )
    args = parser.parse_args()
    variants = {"deploy": []}
    for spec in args.variant:
        label, _, overrides = spec.partition("=")
        variants[label] = shlex.split(overrides)
    root = Path(tempfile.mkdtemp(prefix="deploy-exchange-"))
    print(f"load average at start: {os.getloadavg()[0]:.1f} (1 min)")
    for name, task in TASKS.items():
        if args.only and name != args.only:
            continue
        runs = {"simulation": exchanges(task, ["hardware=cpu_2"], root / name / "sim")}
        for label, overrides in variants.items():
            runs[label] = exchanges(
                task, ["hardware=deploy_local", *overrides], root / name / label
            )
        sim = runs["simulation"][0]
        heads = [h for label in variants for h in (f"{label} s", "ratio", "diff s")]
        print(f"\n{name}: " + ", ".join(f"{k} {w:.0f} s wall" for k, (_, w, _) in runs.items()))
        print("| exchange | round | simulation s | " + " | ".join(heads) + " |")
        print("|---|---|---|" + "---|" * len(heads))
        rows = [
            (phase, rnd, {k: r[0].get((phase, rnd), float("nan")) for k, r in runs.items()})
            for phase, rnd in sim
        ]
        # discover also starts every node's first ClientApp (a Ray actor in the simulation)
        rows.append(
            (
                "all but discover",
                "",
                {k: sum(t[k] for p, _, t in rows if p != "discover") for k in runs},
            )
        )
        for phase, rnd, t in rows:
            s = t["simulation"]
            cells = [f"{t[k]:.2f} | {t[k] / s:.1f} | {t[k] - s:+.2f}" for k in variants]
            print(f"| {phase} | {rnd} | {s:.2f} | " + " | ".join(cells) + " |")
        for label in variants:
            print_stages(f"{name}, {label}", runs[label][0], runs[label][2])
    print(f"\nload average at end: {os.getloadavg()[0]:.1f} (1 min)")


if __name__ == "__main__":
    main()
