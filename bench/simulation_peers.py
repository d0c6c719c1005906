"""Simulation speed against the peers, side by side in one run: fedsim, plain Flower, pfl-research, FLGo.

One workload, identical in every framework (``fedsim_tasks/topical_chat/turn_sentiment.py``:
Topical-Chat turns as cross-device clients, a 2-layer MLP, one local SGD epoch, FedAvg weighted
by examples, the same seed and split), run by each framework's own simulation, one process tree
at a time (``bench/peers/``):

- fedsim with one SuperNode per client, and with two SuperNodes hosting every client
  (``hardware.clients_per_supernode``: one message per SuperNode, one SuperNode per CPU), the
  latter also under ``hardware.client_backend=batched`` (the hosted clients' replies stacked as
  rows, ``fedsim/runtime/row_batches.py``);
- plain Flower 1.41: a ServerApp / ClientApp of Flower's API alone in Flower's simulation;
- pfl-research and FLGo, each with its own simulator (``pip install -e ".[bench]"``).

Per framework and setting: the median seconds of a round after the first (a first round also
starts workers and loads data), the first round, the wall time of the whole process tree,
its peak memory (summed RSS, sampled every 0.2 s), and the final model's test accuracy and loss
(equal work gives equal loss where every client trains every round; with sampling, each
framework draws its own clients), and for fedsim the training replies it did not accept
(``replies_lost``: a failed or timed-out client makes the work unequal). Ratios are to the
fastest in the same setting of the same run.

    .venv/bin/python bench/simulation_peers.py              # 1,000 and 10,000 clients; 100 and all per round
    .venv/bin/python bench/simulation_peers.py --quick      # 1,000 clients, all per round, 2 rounds
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from peers.workload import RESULT
from process_tree import PeakMemory

PEERS = Path(__file__).parent / "peers"
FRAMEWORKS = {  # name -> (runner script, its extra arguments for N clients, the package it needs)
    "fedsim, 1 client / SuperNode": (
        "fedsim_run.py",
        lambda n: ["--clients-per-supernode", "1"],
        "fedsim",
    ),
    "fedsim, 2 SuperNodes": (
        "fedsim_run.py",
        lambda n: ["--clients-per-supernode", str(-(-n // 2))],
        "fedsim",
    ),
    "fedsim, 2 SuperNodes, batched": (
        "fedsim_run.py",
        lambda n: ["--clients-per-supernode", str(-(-n // 2)), "--client-backend", "batched"],
        "fedsim",
    ),
    "plain Flower": ("flower_app.py", lambda n: [], "flwr"),
    "pfl": ("pfl_run.py", lambda n: [], "pfl"),
    "FLGo": ("flgo_run.py", lambda n: [], "flgo"),
}
INSTALL = 'pip install -e ".[bench]" && pip install --no-deps pfl==0.6.0 flgo==0.4.4'


def run_one(
    framework: str, clients: int, per_round: int, rounds: int, seed: int, log: Path
) -> dict:
    """One framework's run in its own process tree: its report, wall time and peak memory."""
    script, extra, package = FRAMEWORKS[framework]
    row = {"framework": framework, "clients": clients, "per_round": per_round, "rounds": rounds}
    if importlib.util.find_spec(package) is None:
        return row | {"error": f"not installed ({INSTALL})"}
    command = [
        sys.executable,
        str(PEERS / script),
        "--clients",
        str(clients),
        "--per-round",
        str(per_round),
        "--rounds",
        str(rounds),
        "--seed",
        str(seed),
        *extra(clients),
    ]
    start = time.monotonic()
    with log.open("w") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True)
        memory = PeakMemory(proc.pid)
        out, _ = proc.communicate()
        row |= {"wall_s": time.monotonic() - start, "peak_gb": memory.stop()}
    lines = [line for line in out.splitlines() if line.startswith(RESULT)]
    if proc.returncode or not lines:
        tail = log.read_text().strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return row | {"error": tail[0][:200]}
    result = json.loads(lines[-1][len(RESULT) :])
    seconds = result.pop("round_seconds")
    steady = seconds[1:] or seconds
    return {**result, **row, "s_per_round": statistics.median(steady), "first_round_s": seconds[0]}


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's round time and memory over the fastest's (and least's) of its setting."""
    for row in rows:
        same = [
            r
            for r in rows
            if (r["clients"], r["per_round"]) == (row["clients"], row["per_round"])
            and "s_per_round" in r
        ]
        if "s_per_round" in row:
            row["x_fastest"] = row["s_per_round"] / min(r["s_per_round"] for r in same)
            row["x_least_memory"] = row["peak_gb"] / min(r["peak_gb"] for r in same)
    return rows


COLUMNS = (
    "framework",
    "clients",
    "per_round",
    "s_per_round",
    "x_fastest",
    "first_round_s",
    "wall_s",
    "peak_gb",
    "x_least_memory",
    "accuracy",
    "loss",
)


def table(rows: list[dict]) -> str:
    def cell(row: dict, key: str) -> str:
        value = row.get(key, "")
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(COLUMNS) + " | error |", "|" + "---|" * (len(COLUMNS) + 1)]
    lines += [
        "| " + " | ".join(cell(r, k) for k in COLUMNS) + f" | {r.get('error', '')} |" for r in rows
    ]
    return "\n".join(lines)


def goals(rows: list[dict]) -> list[str]:
    """The issue's goals, each as measured: met or missed, by how much."""

    def s(name: str, clients: int, per_round: int) -> float | None:
        hit = [
            r
            for r in rows
            if (r["framework"], r["clients"], r["per_round"]) == (name, clients, per_round)
        ]
        return hit[0].get("s_per_round") if hit else None

    out = []
    for clients, per_round in sorted({(r["clients"], r["per_round"]) for r in rows}):
        fedsim, flower = (
            s("fedsim, 1 client / SuperNode", clients, per_round),
            s("plain Flower", clients, per_round),
        )
        if fedsim and flower:
            out.append(
                f"N={clients}, {per_round}/round: fedsim (1 client / SuperNode) over plain Flower "
                f"{fedsim / flower:.2f}x (goal <= 1.1x: {'met' if fedsim / flower <= 1.1 else 'missed'})"
            )
        pfl = s("pfl", clients, per_round)
        for name in ("fedsim, 2 SuperNodes", "fedsim, 2 SuperNodes, batched"):
            ours = s(name, clients, per_round)
            if ours and pfl:
                out.append(
                    f"N={clients}, {per_round}/round: {name} over pfl {ours / pfl:.2f}x "
                    f"(issue 60's goal <= 1.0x: {'met' if ours <= pfl else 'missed'})"
                )
        many = s("fedsim, 2 SuperNodes", clients, per_round)
        peers = [
            v
            for v in (s(name, clients, per_round) for name in ("plain Flower", "pfl", "FLGo"))
            if v
        ]
        if clients >= 10_000 and many and peers:
            ratio = many / min(peers)
            out.append(
                f"N={clients}, {per_round}/round: fedsim (2 SuperNodes) over the fastest peer {ratio:.2f}x "
                f"(goal <= 1.5x: {'met' if ratio <= 1.5 else 'missed'})"
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="1,000 clients, all per round (equal loss), 2 rounds"
    )
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 10_000])
    p.add_argument(
        "--per-round", type=int, nargs="+", default=[100, 0], help="clients per round (0: all)"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=list(FRAMEWORKS))
    p.add_argument("--out", type=Path, default=Path("outputs/simulation_peers"))
    args = p.parse_args()
    if args.quick:
        args.clients, args.per_round, args.rounds = [1000], [0], 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for clients in args.clients:
        for per_round in args.per_round:
            for framework in args.frameworks:
                log = (
                    args.out
                    / f"{re.sub(r'[^a-z0-9]+', '_', framework.lower())}-{clients}-{per_round}.log"
                )
                rows.append(
                    run_one(framework, clients, per_round or clients, args.rounds, args.seed, log)
                )
                print(json.dumps(rows[-1]), flush=True)
    rows = with_ratios(rows)
    report = table(rows) + "\n\n" + "\n".join(f"- {g}" for g in goals(rows)) + "\n"
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    (args.out / "table.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
