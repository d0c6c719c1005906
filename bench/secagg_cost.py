"""SecAgg+ against plaintext FedAvg, one run: ``--clients`` clients (100), ``--drop`` of them (10%)
dropping after they sent their masked inputs (they answer neither the check nor the unmask), in
process through Flower's protobuf wire format (``fedsim/runtime/inprocess_grid.py``) and the one
messaging path, each client through the SecAgg layer.

Prints, per aggregation, medians over ``--repeats`` runs of ``--rounds`` rounds each (the two
alternate, after one run of each not counted: the first pays for imports and caches), each
figure per round (a run's total over its rounds): the server's CPU seconds, the process's CPU
time less the time spent inside the clients' handlers and the wire's client halves (decoding a
message, encoding its reply: ``InProcessGrid.client_wire_seconds``), and, as the first version
of this bench counted it, with the wire both ways counted as the server's; the clients' mean CPU
seconds; bytes up and down per client as Flower's protobuf messages on the wire; for SecAgg, the
largest difference between its mean and the exact weighted mean of every client whose input was
summed, against the largest bound a round states. The ratios are the medians of each repeat's
SecAgg run over its plaintext run (the machine is shared: paired, alternating runs see the same
load). ``--json`` keeps every run's figures. With ``--rounds`` above 1, rounds after the first
run on the keys the clients sent with their last unmask reply.

    PYTHONPATH=. .venv/bin/python bench/secagg_cost.py --clients 100 --drop 0.1 --floats 100000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
from flwr.app import ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedsim.config import node_local
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.privacy.secagg import messages as keys
from fedsim.runtime.client_app import SEED_KEY
from fedsim.runtime.client_state import RUN_KEY
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.secagg_layer import SecAggLayer
from fedsim_strategies.secagg import SecAggPlus


class Client:
    """A node whose training returns a fixed update, through the SecAgg layer; its handler's
    CPU seconds are summed in ``spent`` (they are not the server's)."""

    def __init__(self, state_dir: str, partition_id: int, update, examples, drop_at, spent):
        self.node, self.update, self.examples = {"state-dir": state_dir}, update, examples
        self.drop_at, self.spent = drop_at, spent
        self.layer = SecAggLayer(self, partition_id)

    def __call__(self, msg):
        start = time.process_time()
        try:
            node_local.attach(msg, self.node)
            if self.drop_at and msg.content[keys.CONFIG].get(keys.OP) in self.drop_at:
                return None
            return self.layer.handle(msg)
        finally:
            self.spent.append(time.process_time() - start)

    def handle(self, msg):
        return RecordDict(
            {
                ARRAYS: to_record({"w": self.update}),
                METRICS: MetricRecord({NUM_EXAMPLES: self.examples}),
            }
        )


def one_run(args, secure: bool, updates, examples, dropped) -> dict:
    """``args.rounds`` rounds of one aggregation; figures per round. Under SecAgg+ round 1 asks
    every client for keys, later rounds only those that sent none with their last unmask reply
    (here the clients that drop after masking)."""
    spent: list[float] = []
    drop_at = (keys.CHECK, keys.UNMASK)
    with tempfile.TemporaryDirectory() as state:
        nodes = {
            i + 1: Client(
                state,
                i,
                updates[i],
                examples[i],
                drop_at if i + 1 in dropped and secure else None,
                spent,
            )
            for i in range(args.clients)
        }
        grid = InProcessGrid(nodes, keep_replies=False)
        messenger = Messenger(grid, 0.2, poll_seconds=0.01)
        inner = FedAvg(fraction_evaluate=0.0)
        strategy = (
            SecAggPlus(inner, degree=args.degree, max_weight=float(max(examples)))
            if secure
            else inner
        )
        cpu = time.process_time()
        result = strategy.start(
            messenger.grid("bench"),
            to_record({"w": np.zeros(args.floats, np.float32)}),
            args.rounds,
            30,
            ConfigRecord({SEED_KEY: 0, RUN_KEY: "secagg-bench"}),
        )
        both_ways = time.process_time() - cpu - sum(spent)
    up, down = grid.bytes_up, grid.bytes_down  # on the wire: Flower's protobuf messages
    out = {
        "server_cpu_s": (both_ways - grid.client_wire_seconds) / args.rounds,
        "server_cpu_wire_both_ways_s": both_ways / args.rounds,
        "client_cpu_s": (sum(spent) + grid.client_wire_seconds) / args.clients / args.rounds,
        "kb_up_per_client": up / args.clients / 1e3 / args.rounds,
        "kb_down_per_client": down / args.clients / 1e3 / args.rounds,
        "mean": from_record(result.arrays)["w"].astype(np.float64),
    }
    if secure:
        out["bound"] = max(r["secagg-error-bound"] for r in strategy.rounds.values())
    return out


FIGURES = ("server_cpu_s", "server_cpu_wire_both_ways_s", "client_cpu_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--drop", type=float, default=0.1)
    parser.add_argument("--floats", type=int, default=100_000)
    parser.add_argument("--degree", type=int, default=None, help="SecAgg+ neighbours (null: all)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each, after a warm-up")
    parser.add_argument("--rounds", type=int, default=1, help="rounds a run")
    parser.add_argument("--json", default=None, help="write every round's figures here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    updates = [rng.normal(0, 0.1, args.floats).astype(np.float32) for _ in range(args.clients)]
    examples = [int(e) for e in rng.integers(50, 500, args.clients)]
    dropped = set(rng.choice(np.arange(1, args.clients + 1), int(args.drop * args.clients), False))
    exact = sum(e * u.astype(np.float64) for e, u in zip(examples, updates)) / sum(examples)
    rounds: dict[str, list[dict]] = {"plaintext": [], "secagg": []}
    for repeat in range(args.repeats + 1):
        for name, secure in (("plaintext", False), ("secagg", True)):
            row = one_run(args, secure, updates, examples, dropped)
            if secure:
                row["max_error"] = float(np.abs(row["mean"] - exact).max())
            del row["mean"]
            if repeat:  # the first pair warms up
                rounds[name].append(row)
    plain, secure = rounds["plaintext"], rounds["secagg"]
    median = {
        name: {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        for name, rows in rounds.items()
    }
    ratios = {k: statistics.median(s[k] / p[k] for p, s in zip(plain, secure)) for k in FIGURES[:2]}
    ratios["kb_up_per_client"] = (
        median["secagg"]["kb_up_per_client"] / (median["plaintext"]["kb_up_per_client"])
    )
    error = max(r["max_error"] for r in secure)
    print(
        f"{args.clients} clients, {len(dropped)} dropping after their masked inputs, "
        f"{args.floats} floats, degree {args.degree or 'all'}; medians of {args.repeats} runs of "
        f"{args.rounds} round(s), per round"
    )
    print(
        "| aggregation | server CPU s / round | (wire both ways) | client CPU s | kB up / client "
        "| kB down / client |"
    )
    print("|---|---|---|---|---|---|")
    for name, row in (("plaintext FedAvg", median["plaintext"]), ("SecAgg+", median["secagg"])):
        print(
            f"| {name} | {row['server_cpu_s']:.3f} | {row['server_cpu_wire_both_ways_s']:.3f} | "
            f"{row['client_cpu_s']:.3f} | {row['kb_up_per_client']:.1f} | "
            f"{row['kb_down_per_client']:.1f} |"
        )
    print(
        f"server CPU ratio {ratios['server_cpu_s']:.2f} (wire both ways "
        f"{ratios['server_cpu_wire_both_ways_s']:.2f}), bytes up ratio "
        f"{ratios['kb_up_per_client']:.2f}; max |SecAgg mean - exact mean| {error:.2e} "
        f"(float32 model), stated bound {secure[0]['bound']:.2e}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"settings": vars(args) | {"dropped": len(dropped)}, "rounds": rounds}
                | {"median": median, "ratio": ratios, "max_error": error},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
