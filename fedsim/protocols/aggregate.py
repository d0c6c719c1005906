"""Aggregation only: every SuperNode trains (sends its vector), the strategy aggregates.

Used by ``bench/`` to time a strategy's rounds at scale without evaluation phases.
"""

from __future__ import annotations

import json
import time

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedsim.client_app import TASK_KEY
from fedsim.faults import FAULTS_KEY
from fedsim.grid import ProgressGrid
from fedsim.reply_guard import ReplyGuard, vector_rows_validator
from fedsim.results import RunOutput, markdown_table


def run(grid: ProgressGrid, cfg: DictConfig, out: RunOutput) -> tuple[dict, str]:
    task = OmegaConf.to_container(cfg.task, resolve=True)
    dim = int(cfg.protocol.dim)
    guard = ReplyGuard(instantiate(cfg.strategy), vector_rows_validator("vectors", dim, True))
    nodes = list(grid.get_node_ids())
    config = ConfigRecord({TASK_KEY: json.dumps(task), "splits": task["splits"],
                           FAULTS_KEY: json.dumps(OmegaConf.to_container(cfg.faults))})
    t0 = time.monotonic()
    result = guard.start(grid.subset(nodes, "aggregate"),
                         initial_arrays=ArrayRecord({"vectors": Array(np.full(dim, 1.0 / dim))}),
                         num_rounds=int(cfg.num_rounds), timeout=float(cfg.round_timeout),
                         train_config=config)
    seconds = time.monotonic() - t0
    rounds = int(cfg.num_rounds)
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
