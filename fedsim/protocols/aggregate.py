"""Aggregation only: every SuperNode trains (sends its vector), the strategy aggregates.

Used by ``bench/`` to time a strategy's rounds at scale without evaluation phases.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from omegaconf import DictConfig

from fedsim.grid import ProgressGrid
from fedsim.protocols import vector_protocol_setup
from fedsim.results import RunOutput, markdown_table


def run(grid: ProgressGrid, cfg: DictConfig, out: RunOutput) -> tuple[dict, str]:
    dim, rounds = int(cfg.protocol.dim), int(cfg.num_rounds)
    task, base, guard = vector_protocol_setup(cfg, dim)
    nodes = list(grid.get_node_ids())
    t0 = time.monotonic()
    result = guard.start(grid.subset(nodes, "aggregate"),
                         initial_arrays=ArrayRecord({"vectors": Array(np.full(dim, 1.0 / dim))}),
                         num_rounds=rounds, timeout=float(cfg.round_timeout),
                         train_config=ConfigRecord({**base, "splits": task["splits"]}))
    seconds = time.monotonic() - t0
    released = result.arrays["vectors"].numpy().reshape(-1)
    results = {
        "experiment": cfg.protocol.name, "strategy": cfg.strategy._target_,
        "supernodes": len(nodes), "rounds": rounds, "strategy_seconds": seconds,
        "ms_per_client_round": 1000.0 * seconds / (len(nodes) * rounds),
        "released_sum": float(released.sum()), "faults": guard.faults,
    }
    table = markdown_table([results], ["strategy", "supernodes", "rounds", "strategy_seconds",
                                       "ms_per_client_round"])
    return results, f"# {cfg.protocol.name}\n\n{table}\n"
