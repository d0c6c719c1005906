"""Plain `flwr run .` as a newcomer runs it (issue 66): a fresh clone, an empty HOME, the venv on
PATH, Flower's own detached local SuperLink (`:local:`; its two ports moved off the defaults by
Flower's FLWR_LOCAL_* variables, so that runs elsewhere on the machine are not touched).

- Without FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION, Flower's `uv sync` of the app stops at once
  (pyproject's [tool.uv] managed = false): no dependency is installed, `--stream` shows why.
- A SuperLink started without $FEDSIM_DATA_ROOT keeps that environment: the run says which
  SuperLink (pid) and how to stop it, also after the user exported the variable; a data_root
  override its clients would not see is refused.
- Started again with both variables, the run completes with the clone's commit in its provenance,
  its log in fedsim.log without Flower's ConfigRecord dump, and no checkpoint (no run.key) left.
  Nothing stays running.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from conftest import SMALL, private_tmpdir
from fedsim.config.data import REPO_ROOT, resolve_data_root
from fedsim.run.launcher import BIN, free_port
from fedsim.run.watchdog import run_processes

pytestmark = pytest.mark.e2e

DEPENDENCY_VAR = "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"


def fresh_clone(root: Path) -> Path:
    """A clone of this checkout with its working tree's changes (tracked and new files)."""
    clone = root / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        if (REPO_ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, clone / name)
    return clone


def superlinks(port: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if any(Path(c).name == "flower-superlink" for c in cmd[:2]) and str(port) in cmd:
            found.append(proc)
    return found


def stop(proc: psutil.Process) -> None:
    """The SuperLink and its children; a child that exits with its parent first is gone already
    (the SuperExec watches its parent's pid)."""
    tree = [proc, *proc.children(recursive=True)]
    for p in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    gone, alive = psutil.wait_procs(tree, timeout=15)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


@pytest.fixture
def newcomer():
    root = Path(private_tmpdir())
    clone = fresh_clone(root)
    home = root / "home"
    home.mkdir()
    port = free_port()
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in (DEPENDENCY_VAR, "FEDSIM_DATA_ROOT", "FLWR_HOME", "VIRTUAL_ENV")
    }
    base.update(
        HOME=str(home),
        TMPDIR=str(root),
        PATH=f"{BIN}{os.pathsep}{base.get('PATH', '')}",
        FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port),
        FLWR_LOCAL_CONTROL_API_PORT=str(free_port()),
        FLWR_TELEMETRY_ENABLED="0",
    )

    def flwr(*args, env=None, timeout=300):
        started = time.monotonic()
        done = subprocess.run(
            ["flwr", *args],
            cwd=clone,
            env={**base, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return done.stdout + done.stderr, time.monotonic() - started

    flwr.port, flwr.clone = port, clone
    try:
        yield flwr
    finally:
        for link in superlinks(port):
            stop(link)
        assert run_processes(root) == [], "processes left by flwr run"
        shutil.rmtree(root, ignore_errors=True)


def run_status(flwr, log: str) -> str:
    run_id = re.search(r"Successfully started run (\d+)", log).group(1)
    out, _ = flwr("ls", "--run-id", run_id, "--format", "json")
    return json.loads(out)["runs"][0]["status"]


def test_plain_flwr_run_installs_nothing_and_fails_visibly(newcomer):
    log, seconds = newcomer("run", ".", "--stream")
    print(f"plain `flwr run . --stream`, fresh clone and HOME: {seconds:.1f} s")
    assert "The project is marked as unmanaged" in log, log
    assert "Installed:" not in log and "App dependencies installed" not in log, log
    assert run_status(newcomer, log) == "finished:failed"


@pytest.mark.slow  # four runs through Flower's simulation: 4 min on 2 loaded cores
def test_a_superlink_of_an_earlier_try_is_named_then_a_run_completes(newcomer, tmp_path):
    no_data = {DEPENDENCY_VAR: "1", "FEDSIM_DATA_ROOT": ""}
    log, _ = newcomer("run", ".", "--stream", env=no_data)
    (link,) = superlinks(newcomer.port)
    assert "No data root found" in log and f"SuperLink pid {link.pid}" in log, log
    assert f"kill {link.pid}" in log and "flwr ls --run-id" in log, log

    data = str(resolve_data_root(None))
    exported = {DEPENDENCY_VAR: "1", "FEDSIM_DATA_ROOT": data}
    log, _ = newcomer("run", ".", "--stream", env=exported)  # the same SuperLink, its old env
    assert f"SuperLink pid {link.pid}" in log, log
    override = f"overrides='data_root={data}'"
    log, _ = newcomer("run", ".", "--stream", "--run-config", override, env=no_data)
    assert f"data_root={data} reaches the ServerApp only" in log, log
    assert run_status(newcomer, log) == "finished:failed"

    stop(link)
    out = tmp_path / "results"
    small = f"seed=3 overrides='{' '.join(SMALL)} results_dir={out}'"
    log, seconds = newcomer("run", ".", "--stream", "--run-config", small, env=exported)
    print(f"`flwr run . --stream` (SMALL, SuperLink started with both variables): {seconds:.1f} s")
    assert run_status(newcomer, log) == "finished:completed", log
    prov = json.loads((out / "results.json").read_text())["provenance"]
    head = subprocess.run(
        ["git", "-C", str(newcomer.clone), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert prov["git"]["commit"] == head and prov["command"]["line"].startswith("flwr run ."), prov
    assert f"commit {head}" in (out / "summary.md").read_text()
    assert not (out / "checkpoint").exists()  # run.key, the noise secret, is gone
    assert "INFO fedsim: results ->" in (out / "fedsim.log").read_text()
    assert "ConfigRecord (train)" not in log  # Flower's dump, at logging.level=debug only
