import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fedsim.config.data import resolve_data_root
from fedsim.privacy.secret import derive, run_secret
from fedsim.run.watchdog import run_processes
from fedsim.runtime.journal import open_entry

FEDSIM = str(Path(sys.executable).parent / "fedsim")


def data_root_override() -> str:
    """``data_root=`` naming the data root a run would find (``$FEDSIM_DATA_ROOT``, else
    ``../shared/data`` beside the checkout): a relative ``../shared/data`` named the folder beside
    the working directory and ignored ``$FEDSIM_DATA_ROOT``, so a clone elsewhere failed."""
    return f"data_root={resolve_data_root()}"


SMALL = [
    "task.max_per_split=5",
    "protocol.dp_seeds=2",
    "protocol.bootstrap=200",
]  # 20 conversations


def private_tmpdir() -> str:
    """A TMPDIR of the run's own: the launcher's work folder and Ray's session live under it, so
    the processes working there are the run's. Short, because Ray's socket paths must stay under
    107 characters."""
    return tempfile.mkdtemp(prefix="fsr-", dir="/tmp")


def fedsim_run(*overrides, timeout=400, tmpdir=""):
    """Run the real console script; returns (exit code, combined output). Every run must leave
    no process behind the moment it exits. Its TMPDIR is a private root, or the folder ``tmpdir``
    under it."""
    root = private_tmpdir()
    try:
        (Path(root) / tmpdir).mkdir(exist_ok=True)
        proc = subprocess.run(
            [FEDSIM, "run", *overrides],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "TMPDIR": str(Path(root) / tmpdir)},
        )
        assert run_processes(root) == [], f"processes left by fedsim run {overrides}"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return proc.returncode, proc.stdout + proc.stderr


def fedsim_refusal(*overrides) -> tuple[int, str]:
    """``fedsim run`` in this process, for a run that must be refused before anything starts:
    (exit code, stderr). Saves each case the console script's start (imports, 5-20 s); a case
    that is not refused fails here instead of starting a run. One test per path
    (tests/test_cli_errors.py) keeps the console script's own exit 2."""
    from unittest import mock

    from fedsim.run import cli

    err = io.StringIO()
    with (
        mock.patch.object(cli, "launch", side_effect=AssertionError(f"not refused: {overrides}")),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        code = cli.main(["run", *overrides])
    return code, err.getvalue()


def cmdline(pid: int) -> bytes:
    """A process's command line ('' once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def stop_sweep_mid_point(sweep: list[str], out: Path, root: str, log: Path) -> None:
    """``fedsim run -m <sweep> results_dir=<out>`` under TMPDIR ``root``, stopped by SIGTERM once
    its first point works (a Ray actor runs): the sweep exits 143, its log in ``log``."""
    with open(log, "w") as fh:
        running = subprocess.Popen(
            [FEDSIM, "run", "-m", *sweep, f"results_dir={out}"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": root},
        )
        deadline = time.monotonic() + 180
        while not any(
            b"ray::" in cmdline(pid) for pid in run_processes(root)
        ):  # the point is working
            assert running.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        running.send_signal(signal.SIGTERM)
        assert running.wait(90) == 143


def read_results(path: Path) -> dict:
    return json.loads((path / "results.json").read_text())


def kill_when(
    overrides: list[str], root: str, ready: Callable[[], bool], sig: int = signal.SIGKILL
) -> None:
    """Start ``fedsim run overrides`` with TMPDIR ``root``, send it ``sig`` once ``ready()``
    holds, wait until it has exited and every process of the run has ended (SIGTERM / SIGINT: the
    launcher stops them; SIGKILL: its watchdog), and remove ``root`` (a killed launcher left its
    work folder and Ray's session there)."""
    proc = subprocess.Popen(
        [FEDSIM, "run", *overrides],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env={**os.environ, "TMPDIR": root},
    )
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the kill"
        time.sleep(0.05)
    proc.send_signal(sig)
    assert proc.wait(120) == (-sig if sig == signal.SIGKILL else 128 + sig)
    deadline = time.monotonic() + 60
    while run_processes(root) and time.monotonic() < deadline:  # the watchdog ends the rest
        time.sleep(0.5)
    assert run_processes(root) == []
    shutil.rmtree(root, ignore_errors=True)


def journaled(out: Path) -> list[dict]:
    """The journal's entries of the run in ``out``, opened with the run's own key (each is
    authenticated): each header with its ``replies`` (Flower's wire format)."""
    key = derive(run_secret(out / "checkpoint" / "run.key", resume=True), b"journal")
    entries = [
        open_entry(key, p) for p in sorted((out / "checkpoint" / "journal").glob("*.exchange"))
    ]
    return [{**header, "replies": replies} for header, replies, _ in entries]


def without_timings(value):
    """results.json without what differs between two runs of one experiment (timings, the
    checkpoint's counts, the provenance's times and command), floats compared to 1e-12: the
    order replies arrive in may change a float sum in its last bit."""
    if isinstance(value, dict):
        return {
            k: without_timings(v)
            for k, v in value.items()
            if "seconds" not in k
            and not k.startswith("ms_")
            and k not in ("checkpoint", "timings", "provenance")
        }
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, rel=1e-12, abs=1e-15)
    return value


class Unpickled:
    """What a planted ``.npy`` holds: unpickling it creates ``marker`` (code ran)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on the path whose import leaves a mark: its target, and the mark."""
    name = f"planted_{tmp_path.name.replace('-', '_')}"
    marker = tmp_path / "imported"
    (tmp_path / f"{name}.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\nclass Strategy:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield f"{name}.Strategy", marker
    sys.modules.pop(name, None)


@pytest.fixture
def run_small(tmp_path):
    def run(*overrides, timeout=400):
        out = tmp_path / "results"
        code, log = fedsim_run(*SMALL, f"results_dir={out}", *overrides, timeout=timeout)
        return code, log, out

    return run


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory):
    """The uninterrupted stateful run of a layout (``tests/test_e2e_client_state.py``), made once
    per session: the resume tests there and the Ray cluster test compare their runs with it."""
    from test_e2e_client_state import LAYOUTS, _run

    runs = {}

    def run(layout: str) -> Path:
        if layout not in runs:
            runs[layout] = _run(tmp_path_factory.mktemp(layout), *LAYOUTS[layout])
        return runs[layout]

    return run
