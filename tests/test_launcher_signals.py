"""`fedsim run` stopped by SIGTERM, SIGINT or SIGKILL leaves no process of the run behind.

Every process of a run carries FEDSIM_RUN_TOKEN in its environment (the test names the token),
so the check reads /proc: SuperLink, ServerApp, Ray and its workers alike."""

import os
import signal
import subprocess
import time
import uuid

import pytest

from conftest import FEDSIM, SMALL
from fedsim.watchdog import ENV_KEY, run_processes


def _start(tmp_path):
    token = uuid.uuid4().hex
    log = open(tmp_path / "log.txt", "w+")
    proc = subprocess.Popen([FEDSIM, "run", *SMALL, f"results_dir={tmp_path / 'out'}"],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, ENV_KEY: token})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until Ray's workers run (the ServerApp is working)
        if any(b"ray::" in _cmdline(pid) for pid in run_processes(token)):
            break
        assert proc.poll() is None, (tmp_path / "log.txt").read_text()
        time.sleep(0.5)
    else:
        pytest.fail("the run never started its Ray workers")
    return proc, token, log


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _left(token: str, wait: float = 30.0) -> list[int]:
    deadline = time.monotonic() + wait
    while (pids := run_processes(token)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return pids


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_terminate_and_ctrl_c_stop_everything(tmp_path, sig, code):
    proc, token, log = _start(tmp_path)
    proc.send_signal(sig)
    assert proc.wait(60) == code
    log.seek(0)
    out = log.read()
    assert out.rstrip().endswith("fedsim: interrupted; nothing left running")
    assert "Traceback" not in out
    assert run_processes(token, spare=proc.pid) == []  # already at exit, not eventually


def test_sigkill_takes_the_run_down(tmp_path):
    proc, token, _ = _start(tmp_path)
    proc.kill()
    proc.wait(10)
    assert _left(token) == []
