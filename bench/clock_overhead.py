"""What replaying FedScale-format traces for 10,000 clients costs per round: turn-sentiment
FedAvg (100 clients a round) without a clock and on the trace clock, timed in the same run.

The clients are the workload's real handler (``fedsim_clients/turn_sentiment.py``: one local
epoch of the MLP on each client's turns), in this process behind ``InProcessGrid`` (Flower's
wire format, no Ray: the clock's cost is the server's, and a simulation's process overhead would
only dilute it). Both arms take the run's one messaging path (``Messenger``, ``PhaseGrid``) and
Flower's FedAvg; the clock arm adds what a run with ``clock=trace`` adds: every round the
availability of all 10,000 clients at the round's start, the sampled clients' finish times,
the round's record. Over-selection 1 and no deadline, so that both arms train as many clients
a round. The arms alternate, ``--repeats`` blocks of ``--rounds`` rounds each; printed: the
ratio of the medians of their blocks' seconds per round, the median of each repeat's paired
ratio, and the seconds per round spent inside the clock itself (its ``wait_for`` and
``close_round``, timed in the trace arm), which a loaded machine's noise does not move. The
traces are written by this script in FedScale's format (pickled dicts, lognormal capacities, two
to four online windows a day) and read back by the clock's readers; their reading, once per run,
is reported apart.

    .venv/bin/python bench/clock_overhead.py [--clients 10000] [--per-round 100] [--rounds 5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from omegaconf import OmegaConf

from fedsim.clock.schedule import VirtualClock
from fedsim.config.compose import compose
from fedsim.config.data import resolve_data_root
from fedsim.flower.strategies import strategy_utils
from fedsim.message_keys import PARTITION_ID, SEED, TORCH_THREADS
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.journal import WHOAMI
from fedsim.runtime.messaging import ANY, Messenger, Policy
from fedsim.runtime.records import to_record
from fedsim_clients.turn_sentiment import TurnSentimentClient
from fedsim_tasks.topical_chat.turn_sentiment import WEIGHT_NAMES, Recipe

DAY = 86400


def write_traces(folder: Path, clients: int, seed: int) -> tuple[Path, Path]:
    """FedScale's two traces for ``clients`` clients (ids 1..n, as FedScale numbers them)."""
    rng = np.random.default_rng(seed)
    capacity = {
        i + 1: {"computation": float(ms), "communication": float(kbps)}
        for i, (ms, kbps) in enumerate(
            zip(rng.lognormal(np.log(50), 0.8, clients), rng.lognormal(np.log(5000), 1.0, clients))
        )
    }
    behave = {}
    for i in range(clients):
        edges = np.sort(rng.uniform(0, DAY, 2 * int(rng.integers(2, 5))))
        behave[i + 1] = {
            "duration": float(DAY),
            "active": edges[0::2].tolist(),
            "inactive": edges[1::2].tolist(),
            "finish_time": DAY,
            "model": "bench",
        }
    paths = folder / "client_device_capacity", folder / "client_behave_trace"
    for path, table in zip(paths, (capacity, behave)):
        path.write_bytes(pickle.dumps(table))
    return paths


def handlers(task: dict, data_root: str, clients: int) -> dict:
    """Node ``p + 1`` is partition ``p``: its WHOAMI, and the workload's client for training
    (every client made before the timing: neither arm pays for the clients it meets first)."""
    made = {p: TurnSentimentClient(task, data_root, p, clients) for p in range(clients)}

    def handler(partition: int):
        def handle(msg):
            if WHOAMI in msg.content.config_records:
                return RecordDict({WHOAMI: ConfigRecord({PARTITION_ID: partition})})
            return made[partition].train(msg)

        return handle

    return {p + 1: handler(p) for p in range(clients)}


def block(
    messenger: Messenger, label: str, initial, per_round: int, rounds: int, seed: int
) -> float:
    """Seconds per round of ``rounds`` FedAvg rounds."""
    strategy_utils.random = random.Random(seed)
    strategy = FedAvg(
        fraction_train=per_round / messenger.num_partitions,
        fraction_evaluate=0.0,
        min_train_nodes=per_round,
    )
    start = time.perf_counter()
    strategy.start(
        messenger.grid(label, Policy(ANY), need=per_round),
        initial,
        rounds,
        train_config=ConfigRecord({SEED: seed, TORCH_THREADS: 1}),
    )
    return (time.perf_counter() - start) / rounds


def timed(clock: VirtualClock, spent: list[float]) -> None:
    """Append the seconds of each of the clock's calls from the round loop to ``spent``."""
    for name in ("wait_for", "close_round"):
        call = getattr(clock, name)

        def wrapper(*args, call=call, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - start)

        setattr(clock, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data_root = str(resolve_data_root(None))
    cfg = compose(["experiment=turn_sentiment_fedavg", f"data_root={data_root}"])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    messenger = Messenger(
        InProcessGrid(handlers(task, data_root, args.clients), keep_replies=False),
        600,
        know_partitions=True,
    )
    recipe = Recipe.of(task, data_root)
    initial = to_record(dict(zip(WEIGHT_NAMES, recipe.initial(0))))
    with tempfile.TemporaryDirectory() as folder:
        capacity, behave = write_traces(Path(folder), args.clients, 0)
        settings = {
            "kind": "trace",
            "deadline": None,
            "over_selection": 1.0,
            "trace": {"device_capacity": str(capacity), "availability": str(behave)},
        }
        start = time.perf_counter()
        clock = VirtualClock.of(settings, args.clients, 0)
        read_seconds = time.perf_counter() - start
    block(messenger, "warm-up", initial, args.per_round, 1, 99)  # the data and torch loaded once
    spent: list[float] = []
    timed(clock, spent)
    seconds = {"none": [], "trace": []}
    for repeat in range(args.repeats):
        for arm in ("none", "trace"):
            messenger.clock = clock if arm == "trace" else None
            seconds[arm].append(
                block(messenger, f"{arm}-{repeat}", initial, args.per_round, args.rounds, repeat)
            )
    medians = {arm: statistics.median(s) for arm, s in seconds.items()}
    print(
        json.dumps(
            {
                "clients": args.clients,
                "per_round": args.per_round,
                "rounds_per_block": args.rounds,
                "repeats": args.repeats,
                "seconds_per_round": seconds,
                "median_seconds_per_round": medians,
                "ratio_trace_to_none": medians["trace"] / medians["none"],
                "median_paired_ratio": statistics.median(
                    t / n for t, n in zip(seconds["trace"], seconds["none"])
                ),
                "clock_seconds_per_round": sum(spent) / (args.repeats * args.rounds),
                "clock_share_of_trace_round": sum(spent) / (args.rounds * sum(seconds["trace"])),
                "clock_first_wait_seconds": spent[0],  # from virtual second 0, before any window
                "clock_median_call_seconds": statistics.median(spent),
                "trace_read_seconds": read_seconds,
                "virtual_seconds": clock.now,
                "stragglers": clock.report()["stragglers"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
