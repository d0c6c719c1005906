"""FedAvg of the turn-sentiment MLP over many small clients, each round timed: fedsim's side of
``bench/simulation_peers.py`` (the same workload runs there in plain Flower, pfl and FLGo).

A round's seconds run from the end of the previous round's server evaluation to the start of
this round's: sampling, sending, the clients' epochs, the replies' checks and the aggregate, as
a peer's round is timed; the evaluation of the test turns is left out everywhere.
"""

from __future__ import annotations

import time

from flwr.app import ArrayRecord, MetricRecord
from omegaconf import DictConfig, OmegaConf

from fedsim.config.schema import layout
from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import RunOutput
from fedsim.runtime.messaging import Messenger, client_config
from fedsim.runtime.records import from_record, to_record
from fedsim_clients import turn_sentiment_messages as keys
from fedsim_experiments.common import RunContext, discover
from fedsim_experiments.turn_sentiment import report
from fedsim_tasks.topical_chat.turn_sentiment import WEIGHT_NAMES, Recipe


class RoundClock:
    """Flower's ``evaluate_fn``: the test metrics after each round, and each round's seconds
    without the evaluation (Flower calls it before round 1 and after every round)."""

    def __init__(self, recipe: Recipe):
        self.recipe, self.seconds, self.curve, self._left = recipe, [], [], None

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        entered = time.monotonic()
        if self._left is not None:
            self.seconds.append(entered - self._left)
        weights = from_record(arrays)
        metrics = self.recipe.evaluate([weights[name] for name in WEIGHT_NAMES])
        self.curve.append({"round": server_round, **metrics})
        self._left = time.monotonic()
        return MetricRecord(metrics)


def run(
    messenger: Messenger, cfg: DictConfig, out: RunOutput, plan: PrivacyPlan
) -> tuple[dict, str]:
    task = OmegaConf.to_container(cfg.task, resolve=True)
    recipe = Recipe.of(task, task["data_root"])
    clients = messenger.num_partitions
    per_round = min(cfg.protocol.clients_per_round or clients, clients)
    base = client_config(cfg)
    nodes, info = discover(
        messenger,
        base,
        keys.discover_reply(messenger.partition_of, lambda p: recipe.examples(p, clients), clients),
    )
    ctx = RunContext(messenger, cfg, base, nodes, {p: dict(i) for p, i in info.items()}, plan=plan)
    clock = RoundClock(recipe)
    ctx.fedavg(
        "train",
        to_record(dict(zip(WEIGHT_NAMES, recipe.initial(cfg.seed)))),
        int(cfg.num_rounds),
        {**base, keys.SEED: cfg.seed, keys.TORCH_THREADS: 1},
        per_round / clients,
        lambda sent: keys.train_reply(sent, ctx.declared(keys.NUM_EXAMPLES)),
        evaluate_fn=clock,
        min_train_nodes=per_round,
    )
    results = {
        "experiment": cfg.protocol.name,
        "clients": clients,
        "supernodes": layout(cfg.hardware, clients)[1],
        "clients_per_round": per_round,
        "rounds": int(cfg.num_rounds),
        "round_seconds": clock.seconds,
        "seconds_per_round": sum(clock.seconds) / max(len(clock.seconds), 1),
        **{k: v for k, v in clock.curve[-1].items() if k != "round"},
        "curve": clock.curve,
        **on_the_clock(messenger, clock.curve, cfg.protocol.target_loss),
    }
    return results, report.summary(results)


def on_the_clock(messenger: Messenger, curve: list[dict], target_loss: float | None) -> dict:
    """Under a virtual clock: each curve point's virtual time (the end of its round, or of its
    asynchronous server step), the run's, and the first at which the test loss reached
    ``target_loss`` (None: never, or no target)."""
    if messenger.clock is None:
        return {}
    ends = {r["round"]: r["virtual_end"] for r in messenger.clock.rounds}
    for point in curve:
        point["virtual_time"] = ends.get(point["round"], 0.0)
    reached = [
        p["virtual_time"] for p in curve if target_loss is not None and p["loss"] <= target_loss
    ]
    return {
        "virtual_time": messenger.clock.now,
        "virtual_time_to_target": reached[0] if reached else None,
    }
