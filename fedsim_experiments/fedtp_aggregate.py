"""Aggregation only: every SuperNode trains (sends its vectors), the strategy aggregates.

Used by ``bench/`` to time a strategy's rounds at scale without evaluation phases. The vector
length is the data's number of topics.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from omegaconf import DictConfig

from fedsim.messaging import Messenger, client_config
from fedsim.results import RunOutput, markdown_table
from fedsim.schema import layout
from fedsim_clients import fedtp_messages as keys
from fedsim_experiments.fedtp import dp_strategy, prior_policy
from fedsim_tasks.topical_chat.dataset import load_topics


def run(messenger: Messenger, cfg: DictConfig, out: RunOutput) -> tuple[dict, str]:
    dim, rounds = len(load_topics(cfg.data_root)), int(cfg.num_rounds)
    nodes = messenger.node_ids()
    t0 = time.monotonic()
    strategy = dp_strategy(cfg, messenger)
    result = strategy.start(
        messenger.grid("aggregate", prior_policy(dim, getattr(strategy, "max_rows_per_reply", None))),
        initial_arrays=ArrayRecord({keys.VECTORS: Array(np.full(dim, 1.0 / dim))}),
        num_rounds=rounds, timeout=float(cfg.round_timeout),
        train_config=ConfigRecord({**client_config(cfg), keys.SPLITS: list(cfg.task.splits)}))
    seconds = time.monotonic() - t0
    released = result.arrays[keys.VECTORS].numpy().reshape(-1)
    results = {
        "experiment": cfg.protocol.name, "strategy": cfg.strategy._target_,
        "clients": len(nodes), "supernodes": layout(cfg.hardware, len(nodes))[1], "rounds": rounds,
        "dim": dim, "strategy_seconds": seconds,
        "ms_per_client_round": 1000.0 * seconds / (len(nodes) * rounds),
        "released": released.tolist(),
    }
    table = markdown_table([results], ["strategy", "clients", "supernodes", "rounds", "strategy_seconds",
                                       "ms_per_client_round"])
    return results, f"# {cfg.protocol.name}\n\n{table}\n"
