"""Server-side experiment protocols, named by ``protocol.run`` in an experiment config."""

from __future__ import annotations

import json

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedsim.client_app import TASK_KEY
from fedsim.faults import FAULTS_KEY
from fedsim.reply_guard import ReplyGuard, vector_rows_validator


def client_setup(cfg: DictConfig) -> tuple[dict, dict]:
    """The resolved task and the config every client message carries (task and fault spec)."""
    task = OmegaConf.to_container(cfg.task, resolve=True)
    return task, {TASK_KEY: json.dumps(task),
                  FAULTS_KEY: json.dumps(OmegaConf.to_container(cfg.faults))}


def vector_protocol_setup(cfg: DictConfig, dim: int) -> tuple[dict, dict, ReplyGuard]:
    """The resolved task, the config every client message carries (task and fault spec), and
    the configured strategy guarded against replies that are not finite (rows, dim) matrices
    of non-negative mass."""
    task, base = client_setup(cfg)
    guard = ReplyGuard(instantiate(cfg.strategy),
                       vector_rows_validator("vectors", dim, nonnegative=True))
    return task, base, guard
