"""`fedsim run` stopped by SIGTERM, SIGINT or SIGKILL leaves no process of the run behind.

Each run gets a TMPDIR of its own; the launcher starts everything in a work folder under it, so
the check reads /proc for processes working there: SuperLink, ServerApp, Ray and its agents
(which overwrite their environment, so a token in it would miss them) alike."""

import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import FEDSIM, SMALL, cmdline, private_tmpdir
from fedsim.run.watchdog import run_processes

pytestmark = pytest.mark.e2e


@pytest.fixture
def root():
    path = private_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start(tmp_path, root):
    log = open(tmp_path / "log.txt", "w+")
    proc = subprocess.Popen(
        [FEDSIM, "run", *SMALL, f"results_dir={tmp_path / 'out'}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": root},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until Ray's workers run (the ServerApp is working)
        if any(b"ray::" in cmdline(pid) for pid in run_processes(root)):
            break
        assert proc.poll() is None, (tmp_path / "log.txt").read_text()
        time.sleep(0.5)
    else:
        pytest.fail("the run never started its Ray workers")
    return proc, log


def _left(root: str, wait: float = 30.0) -> list[int]:
    deadline = time.monotonic() + wait
    while (pids := run_processes(root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return pids


@pytest.mark.parametrize(
    "sig,code",
    [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.exhaustive)],
)
def test_terminate_and_ctrl_c_stop_everything(tmp_path, root, sig, code):
    proc, log = _start(tmp_path, root)
    proc.send_signal(sig)
    assert proc.wait(60) == code
    log.seek(0)
    out = log.read()
    assert out.rstrip().endswith("fedsim: interrupted; nothing left running")
    assert "Traceback" not in out
    assert run_processes(root, spare=proc.pid) == []  # already at exit, not eventually


@pytest.mark.exhaustive  # 32 s; by default kill_when's SIGKILL (tests/test_e2e_client_state.py) checks the same
def test_sigkill_takes_the_run_down(tmp_path, root):
    proc, _ = _start(tmp_path, root)
    proc.kill()
    proc.wait(10)
    assert _left(root) == []
