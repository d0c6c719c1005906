"""Hydra composition of a run, with errors that name the valid choices and keys."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import time
from pathlib import Path

from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.errors import HydraException, InstantiationException
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedsim.config import schema  # registers the typed schema with Hydra
from fedsim.config.data import REPO_ROOT, DataNotFoundError, reads_data, resolve_data_root

CONF_DIR = REPO_ROOT / "conf"
GROUPS = ("task", "strategy", "privacy", "hardware", "clock", "experiment")


class ConfigError(ValueError):
    """A bad override or config value; the message says what is valid."""


# what a refused config raises, from composition to the strategy built once: `fedsim run` exits 2
# with it, the ServerApp logs it before it sends anything
REFUSED = (ConfigError, InstantiationException, ValueError, FileNotFoundError, ImportError)
RESUMABLE = ("hardware", "round_timeout", "data_root", "logging")  # keys a resume may change
RUN_STATE = (
    "results_dir",
    "ship_results",
    "checkpoint",
    "resume",
    "sweep",
    "client_state",
)  # a run's bookkeeping


def choices(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _explain(overrides: list[str], exc: Exception) -> str:
    lines = [str(exc).strip()]
    if exc.__cause__ is not None:  # e.g. the typed schema's "could not be converted to Integer"
        lines.append(str(exc.__cause__).strip())
    for item in overrides:
        key, _, value = item.lstrip("+~").partition("=")
        if key in GROUPS and value not in choices(key):
            lines.append(f"'{value}' is not a {key}; valid choices: {', '.join(choices(key))}")
    lines.append("Valid groups: " + "; ".join(f"{g}={{{','.join(choices(g))}}}" for g in GROUPS))
    return "\n".join(lines)


def _check_keys(cfg: DictConfig, overrides: list[str]) -> None:
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or key.startswith(("+", "~", "hydra.")) or key in GROUPS:
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(node, DictConfig) and leaf not in node:
            near = difflib.get_close_matches(leaf, list(node.keys()), n=3)
            raise ConfigError(
                f"Unknown config key '{key}'."
                + (f" Did you mean: {', '.join(near)}?" if near else "")
                + f" Keys under '{parent or '<root>'}': {', '.join(map(str, node))}"
            )


def compose(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose conf/config.yaml with ``overrides``; resolve data_root and the output folders."""
    overrides = list(overrides)
    if any(o.lstrip("+").startswith("task.data_root=") for o in overrides):
        raise ConfigError(  # the server's task would read one folder, its clients another
            "task.data_root is the task's copy of data_root (the clients read data_root's): "
            "set data_root=..."
        )
    try:
        with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose("config", overrides=overrides, return_hydra_config=False)
    except (HydraException, OmegaConfBaseException) as exc:
        if "not in struct" in str(exc) or "Could not override" in str(exc):
            with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
                base = hydra_compose(
                    "config", overrides=[o for o in overrides if o.split("=")[0] in GROUPS]
                )
            _check_keys(base, overrides)
        raise ConfigError(_explain(overrides, exc)) from exc
    # conf/ holds every value, the schema none to fill in: a key without one (`KEY=???`, or a
    # top-level `~KEY`: only the root takes deletions) is refused here, not met by a process
    unset = OmegaConf.missing_keys(cfg) | {
        f.name for f in dataclasses.fields(schema.RunConfig) if f.name not in cfg
    }
    if unset:
        raise ConfigError(
            f"No value for {', '.join(sorted(unset))}: every key needs one in conf/ or an override"
        )
    OmegaConf.set_struct(cfg, False)
    try:
        if reads_data(cfg.task):
            cfg.data_root = str(resolve_data_root(cfg.data_root))
    except DataNotFoundError:
        if cfg.hardware.backend == "simulation" or cfg.hardware.launch_local:
            raise  # a remote run's data lives on the SuperLink and SuperNode hosts
    if not cfg.results_dir:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        cfg.results_dir = str(Path.cwd() / "outputs" / cfg.protocol.name / stamp)
    cfg.results_dir = str(Path(cfg.results_dir).expanduser().resolve())
    cfg.logging.mlflow_dir = str(Path(cfg.logging.mlflow_dir).expanduser().resolve())
    OmegaConf.set_struct(cfg, True)
    return cfg


def hydra_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Hydra's own node for ``overrides`` (its version, the config search path, the chosen
    option of every group, the overrides), as an ``@hydra.main`` app has it in
    ``.hydra/hydra.yaml``: what ``fedsim run --cfg hydra`` and ``--info`` print."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides), return_hydra_config=True).hydra


def compose_checked(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """:func:`compose`, then every check that needs no data or process: the schema, the protocol
    block, the strategy and its privacy wrapper built once. ``fedsim run`` and the ServerApp
    (for ``flwr run --run-config``) both start here."""
    cfg = compose(overrides)
    schema.check(cfg)
    schema.try_strategy(cfg)
    return cfg


def population(cfg: DictConfig) -> int:
    """The task's own number of clients (its client class's ``population_size``, which reads
    the data): what ``hardware.num_clients: null`` stands for."""
    task = OmegaConf.to_container(cfg.task, resolve=True)
    return int(get_class(task["client"]).population_size(task, cfg.data_root))


def experiment_digest(cfg: DictConfig) -> str:
    """A digest of every key that decides what the run computes (all but :data:`RESUMABLE` and
    :data:`RUN_STATE`; interpolations unresolved, so a moved data root keeps it): the journal is
    bound to it, and a resume under any other is refused by the ServerApp itself."""
    kept = {
        k: OmegaConf.to_container(v, resolve=False) if isinstance(v, DictConfig) else v
        for k, v in cfg.items_ex(resolve=False)
        if k not in RESUMABLE + RUN_STATE
    }
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()
