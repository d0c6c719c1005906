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
ratio, the seconds per round spent inside the clock itself (its ``wait_mask`` and
``close_round``, timed in the trace arm), and in the whole path the trace arm adds on the server
(``clock_path_seconds_per_round``: PhaseGrid's sampling among the online clients and its
round's tasks, schedule and record, timed in the trace arm; ``ratio_none_plus_clock_path`` adds
it to the no-clock arm's median), which a loaded machine's noise moves much less than the
arms' ratio; the load average at the start and end; with ``--profile``, one more block an arm
under cProfile (milliseconds per round in the functions of that path). The
traces are written by this script in FedScale's format (pickled dicts, lognormal capacities, two
to four online windows a day) and read back by the clock's readers; their reading, once per run,
is reported apart.

    .venv/bin/python bench/clock_overhead.py [--clients 10000] [--per-round 100] [--rounds 5] [--repeats 3] \
        [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pickle
import pstats
import random
import statistics
import subprocess
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
from fedsim.runtime.messaging import ANY, Messenger, PhaseGrid, Policy
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
    for name in ("wait_mask", "close_round"):
        call = getattr(clock, name)

        def wrapper(*args, call=call, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent.append(time.perf_counter() - start)

        setattr(clock, name, wrapper)


PATH = ("get_node_ids", "population", "_on_clock", "dispatch")


def timed_path(spent: dict[str, float]) -> None:
    """Add to ``spent`` the seconds of PhaseGrid's calls on a clock: what the trace arm adds on
    the server is ``get_node_ids`` beyond ``population`` (who is online, among all clients)
    and ``_on_clock`` beyond ``dispatch`` (the replies' tasks, the round's schedule and record)."""
    for name in PATH:
        call = getattr(PhaseGrid, name)

        def wrapper(self, *args, call=call, name=name, **kwargs):
            start = time.perf_counter()
            try:
                return call(self, *args, **kwargs)
            finally:
                if self.messenger.clock is not None:
                    spent[name] += time.perf_counter() - start

        setattr(PhaseGrid, name, wrapper)


def profiled(messenger: Messenger, clock: VirtualClock, initial, args) -> dict:
    """One more block an arm under cProfile: each arm's milliseconds per round in the functions
    of the clock's path and of the sampling both arms share (cumulative, the profiler's own
    cost included)."""
    names = {
        "get_node_ids",
        "population",
        "node_ids",
        "sample_nodes",
        "_on_clock",
        "bytes_down",
        "tasks",
        "close_round",
        "wait_mask",
        "online_mask",
        "count",
    }
    table = {}
    for arm in ("none", "trace"):
        messenger.clock = clock if arm == "trace" else None
        profile = cProfile.Profile()
        profile.enable()
        block(messenger, f"profile-{arm}", initial, args.per_round, args.rounds, 7)
        profile.disable()
        stats = pstats.Stats(profile).stats
        table[arm] = {
            f"{Path(file).name}:{function}": round(1000 * row[3] / args.rounds, 3)
            for (file, _, function), row in stats.items()
            if function in names and ("fedsim" in file or "strategy_utils" in file)
        }
    return table


def commit() -> str:
    """The code's commit (with ``+dirty`` for uncommitted changes), or ``unknown``."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--profile", action="store_true", help="then one block an arm under cProfile"
    )
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
    path = dict.fromkeys(PATH, 0.0)
    timed_path(path)
    seconds = {"none": [], "trace": []}
    load_start = os.getloadavg()
    for repeat in range(args.repeats):
        for arm in ("none", "trace"):
            messenger.clock = clock if arm == "trace" else None
            seconds[arm].append(
                block(messenger, f"{arm}-{repeat}", initial, args.per_round, args.rounds, repeat)
            )
    medians = {arm: statistics.median(s) for arm, s in seconds.items()}
    rounds = args.repeats * args.rounds
    path_seconds = (
        path["get_node_ids"] - path["population"] + path["_on_clock"] - path["dispatch"]
    ) / rounds
    after_first = path_seconds - spent[0] / rounds  # the first wait, once a run, left out
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
                "clock_seconds_per_round": sum(spent) / rounds,
                "clock_path_seconds_per_round": path_seconds,
                "ratio_none_plus_clock_path": (medians["none"] + path_seconds) / medians["none"],
                "clock_path_seconds_per_round_after_first_wait": after_first,
                "ratio_none_plus_clock_path_after_first_wait": (medians["none"] + after_first)
                / medians["none"],
                "clock_share_of_trace_round": sum(spent) / (args.rounds * sum(seconds["trace"])),
                "clock_first_wait_seconds": spent[0],  # from virtual second 0, before any window
                "clock_median_call_seconds": statistics.median(spent),
                "trace_read_seconds": read_seconds,
                "virtual_seconds": clock.now,
                "stragglers": clock.report()["stragglers"],
                "load_average_1_5_15": {
                    "start": [round(x, 2) for x in load_start],
                    "end": [round(x, 2) for x in os.getloadavg()],
                },
                "commit": commit(),
                **(
                    {"profile_ms_per_round": profiled(messenger, clock, initial, args)}
                    if args.profile
                    else {}
                ),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
