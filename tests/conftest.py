import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fedsim.watchdog import run_processes

FEDSIM = str(Path(sys.executable).parent / "fedsim")
SMALL = ["task.max_per_split=5", "protocol.dp_seeds=2", "protocol.bootstrap=200"]  # 20 conversations


def private_tmpdir() -> str:
    """A TMPDIR of the run's own: the launcher's work folder and Ray's session live under it, so
    the processes working there are the run's. Short, because Ray's socket paths must stay under
    107 characters."""
    return tempfile.mkdtemp(prefix="fsr-", dir="/tmp")


def fedsim_run(*overrides, timeout=400):
    """Run the real console script; returns (exit code, combined output). Every run must leave
    no process behind the moment it exits."""
    root = private_tmpdir()
    try:
        proc = subprocess.run([FEDSIM, "run", *overrides], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "TMPDIR": root})
        assert run_processes(root) == [], f"processes left by fedsim run {overrides}"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return proc.returncode, proc.stdout + proc.stderr


def cmdline(pid: int) -> bytes:
    """A process's command line ('' once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def read_results(path: Path) -> dict:
    return json.loads((path / "results.json").read_text())


@pytest.fixture
def run_small(tmp_path):
    def run(*overrides, timeout=400):
        out = tmp_path / "results"
        code, log = fedsim_run(*SMALL, f"results_dir={out}", *overrides, timeout=timeout)
        return code, log, out
    return run
