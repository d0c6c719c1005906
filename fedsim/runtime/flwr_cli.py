"""What the ServerApp does differently when Flower's own CLI started it (``flwr run .``) instead of
``fedsim run``: name the SuperLink whose environment the run has, say where a failure is seen,
and do what ``fedsim run`` does after a run (provenance, checkpoint cleanup).

``flwr run .`` starts a detached local SuperLink on first use and every later run executes in its
process tree, with the environment it was started in: a variable exported afterwards
(``FEDSIM_DATA_ROOT``, ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION``) reaches no run until
that SuperLink is stopped. Flower 1.42 names neither it nor its pid, and its CLI exits 0 when a
run fails, so the ServerApp says both in the run's log, which ``--stream`` prints.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import psutil
from omegaconf import OmegaConf

from fedsim.config.compose import ConfigError
from fedsim.config.data import ENV_VAR as DATA_ROOT_ENV
from fedsim.config.data import REPO_ROOT
from fedsim.config.node_local import SETTINGS
from fedsim.results import provenance

RUN_TOKEN_ENV = "FEDSIM_RUN_TOKEN"  # set by `fedsim run` on every process of its runs
SUPERLINK = "flower-superlink"


def started_by_flwr_cli() -> bool:
    """True when no ``fedsim run`` started this process's SuperLink (``flwr run`` did)."""
    return RUN_TOKEN_ENV not in os.environ


def superlink() -> psutil.Process | None:
    """The ``flower-superlink`` this process runs under (an ancestor), None where none is."""
    for parent in psutil.Process().parents():
        try:
            if any(Path(part).name == SUPERLINK for part in parent.cmdline()[:2]):
                return parent
        except psutil.Error:
            continue
    return None


def superlink_note() -> str:
    """Which SuperLink's environment this run has, and how to stop it ("" outside one)."""
    link = superlink()
    if link is None:
        return ""
    try:
        started = datetime.fromtimestamp(link.create_time()).strftime("%Y-%m-%d %H:%M:%S")
        folder = link.cwd()
    except psutil.Error:
        started, folder = "earlier", "?"
    return (
        f"This run has the environment of Flower's SuperLink pid {link.pid}, started {started} in "
        f"{folder}: a variable exported after that (${DATA_ROOT_ENV}, "
        f"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION) reaches no run of it. Stop it with "
        f"`kill {link.pid}`, then run `flwr run . --stream` again from the shell that has them."
    )


def failure_note(run_id: int) -> str:
    """Where a failed run of ``flwr run`` shows (its CLI exits 0 all the same)."""
    return (
        f"Run {run_id} failed (`flwr run` exits 0 all the same): `flwr ls --run-id {run_id}` "
        f"shows finished:failed, `flwr log {run_id} --show` this log (docs/usage.md, `flwr run .`)."
    )


def refuse_settings_clients_miss(overrides: list[str], cfg) -> None:
    """An override of a client's own folder (``data_root``, ``client_state.dir``,
    ``task.he.key_dir``, ``task.embedding_cache``) reaches this ServerApp only: the clients of
    Flower's local simulation read the variable of the SuperLink's environment for it and take no
    folder from the server (``fedsim/config/node_local.py``). Refused unless that variable names
    the same folder, before any client uses the other one."""
    for var, path in SETTINGS.values():
        if not any(o.lstrip("+").startswith(f"{path}=") for o in overrides):  # `++key=` too
            continue
        ours, theirs = OmegaConf.select(cfg, path), os.environ.get(var)
        if ours is None or (theirs and _same_folder(theirs, ours)):
            continue
        raise ConfigError(
            f"{path}={ours} reaches the ServerApp only: under `flwr run` the clients read ${var} "
            f"of the SuperLink's environment, which is {theirs or 'unset'}. Export "
            f"{var}={ours} before the SuperLink starts (or use `fedsim run {path}=...`, which "
            f"hands it to its clients). {superlink_note()}"
        )


def _same_folder(a: str, b: str) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def checkout() -> dict:
    """The git state of the checkout the app was submitted from, as far as this process can
    tell: the SuperLink's folder (where ``flwr run .`` started it), when its tracked files are
    the app's (Flower's installed copy holds no git metadata). Else commit None, with why (a
    host without git, as the Docker images are, is one: its run goes on)."""
    folder = Path.cwd()
    if shutil.which("git") is None:
        return {"commit": None, "dirty": None, "note": "no git on the ServerApp's host"}
    top = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if top.returncode:
        return {"commit": None, "dirty": None, "note": f"{folder} is no git checkout"}
    root = Path(top.stdout.strip())
    differ = [
        name
        for name in _app_files(REPO_ROOT)
        if not (root / name).is_file()
        or (root / name).read_bytes() != (REPO_ROOT / name).read_bytes()
    ]
    if differ:
        return {
            "commit": None,
            "dirty": None,
            "note": f"the app differs from the checkout {root} ({differ[0]}, ...)",
        }
    return {**provenance.git_state(root), "checkout": str(root)}


def _app_files(app: Path) -> list[str]:
    return sorted(
        str(p.relative_to(app))
        for p in app.rglob("*.py")
        if "__pycache__" not in p.parts and ".flwr" not in p.parts
    )


def command(run_id: int, run_config) -> dict:
    """The ``flwr run`` command this run is, with the run config keys it set."""
    given = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in run_config.items() if v != "")
    line = "flwr run ." + (f" --run-config {shlex.quote(given)}" if given else "")
    return {"line": line, "run_id": run_id, "cwd": os.getcwd()}
