"""What every runner of ``bench/simulation_peers.py`` shares: its command line and its report.

Each runner (``fedsim_run.py``, ``flower_app.py``, ``pfl_run.py``, ``flgo_run.py``) is started as
its own process with the same arguments, runs FedAvg of the workload
(:class:`fedsim_tasks.topical_chat.turn_sentiment.Recipe`) for ``--rounds`` rounds over
``--clients`` clients, ``--per-round`` of them sampled per round, and prints one line
``RESULT {json}`` last: the seconds of each round (from the start of its client work to the
aggregate, evaluation excluded), the test accuracy and loss of the final model, and what ran.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from omegaconf import OmegaConf

from fedsim.config.compose import CONF_DIR
from fedsim.config.data import resolve_data_root
from fedsim_tasks.topical_chat.turn_sentiment import Recipe

RESULT = "RESULT "


@dataclass(frozen=True)
class Setting:
    recipe: Recipe
    clients: int
    per_round: int
    rounds: int
    seed: int


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--clients", type=int, required=True)
    p.add_argument("--per-round", type=int, required=True, help="clients sampled per round")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-root", default=None)
    return p


def setting(args: argparse.Namespace) -> Setting:
    """The run's setting; the recipe's values are fedsim's task config (``conf/task/turn_sentiment.yaml``)."""
    if not 0 < args.per_round <= args.clients:
        raise SystemExit(f"--per-round {args.per_round} must be in 1..{args.clients}")
    os.environ.setdefault(
        "OMP_NUM_THREADS", "1"
    )  # one thread per client process, in every framework
    task = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "task" / "turn_sentiment.yaml"))
    return Setting(
        Recipe.of(task, str(resolve_data_root(args.data_root))),
        args.clients,
        args.per_round,
        args.rounds,
        args.seed,
    )


def report(round_seconds: list[float], final: dict, **extra) -> None:
    """The runner's last line."""
    print(RESULT + json.dumps({"round_seconds": round_seconds, **final, **extra}), flush=True)
