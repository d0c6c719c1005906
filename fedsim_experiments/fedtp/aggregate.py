"""Aggregation only: every SuperNode trains (sends its vectors), the strategy aggregates.

Used by ``bench/`` to time a strategy's rounds at scale without evaluation phases. The vector
length is the data's number of topics.
"""

from __future__ import annotations

import math
import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from omegaconf import DictConfig

from fedsim.config.schema import layout
from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import RunOutput, markdown_table
from fedsim.runtime.messaging import Messenger, client_config
from fedsim_clients import fedtp_messages as keys
from fedsim_clients.topic_preference import hosted_rows
from fedsim_experiments.common import build_strategy
from fedsim_experiments.fedtp.protocol import prior_policy
from fedsim_tasks.topical_chat.dataset import load_topics, row_splits


def run(
    messenger: Messenger, cfg: DictConfig, out: RunOutput, plan: PrivacyPlan
) -> tuple[dict, str]:
    dim, rounds = len(load_topics(cfg.data_root)), int(cfg.num_rounds)
    nodes = messenger.node_ids()
    t0 = time.monotonic()
    strategy = build_strategy(cfg, plan, len(nodes))
    splits = row_splits(cfg.data_root, tuple(cfg.task.splits), cfg.task.get("max_per_split"))
    cap = getattr(strategy, "max_rows_per_reply", None) or math.inf
    partitions = (
        messenger.num_partitions
    )  # once: it lists every node (per reply it made the round quadratic)

    def rows(node: int) -> float:
        """The conversations the node's partition hosts (any number where it told none)."""
        partition = messenger.partition_of(node)
        hosted = (
            math.inf if partition is None else len(hosted_rows(len(splits), partitions, partition))
        )
        return min(hosted, cap)

    result = strategy.start(
        messenger.grid("aggregate", prior_policy(dim, rows)),
        initial_arrays=ArrayRecord({keys.VECTORS: Array(np.full(dim, 1.0 / dim))}),
        num_rounds=rounds,
        timeout=float(cfg.round_timeout),
        train_config=ConfigRecord({**client_config(cfg), keys.SPLITS: list(cfg.task.splits)}),
    )
    seconds = time.monotonic() - t0
    released = result.arrays[keys.VECTORS].numpy().reshape(-1)
    results = {
        "experiment": cfg.protocol.name,
        "strategy": cfg.strategy._target_,
        "clients": len(nodes),
        "supernodes": layout(cfg.hardware, len(nodes))[1],
        "rounds": rounds,
        "dim": dim,
        "strategy_seconds": seconds,
        "ms_per_client_round": 1000.0 * seconds / (len(nodes) * rounds),
        "released": released.tolist(),
    }
    table = markdown_table(
        [results],
        ["strategy", "clients", "supernodes", "rounds", "strategy_seconds", "ms_per_client_round"],
    )
    return results, f"# {cfg.protocol.name}\n\n{table}\n"
