"""Kills a run's processes when ``fedsim run`` dies, however it dies (SIGKILL included).

``python -m fedsim.run.watchdog TOKEN WORKDIR LAUNCHER_PID`` runs in its own session with a pipe from
the launcher on stdin. A pipe reaches EOF when its writer closes it or dies, and the kernel closes
it for a killed process too: no polling, no parent-death signal (which only reaches direct
children, not the ServerApp and Ray processes the SuperLink spawns). On EOF the watchdog ends
every process of the run, sparing the launcher: the ServerApp first, at once (SIGKILL), then the
rest: SIGTERM, then SIGKILL.

Why the ServerApp first: it journals every exchange it completes (``fedsim/runtime/journal.py``). Ended
after the SuperNodes or Ray's actors, it would see their ClientApps die mid-exchange, count them
``failed`` and journal that exchange; a resumed run would then replay the failures as if a
client had failed, and end with other results than an uninterrupted run. The SuperLink starts
the ServerApp (``flwr-serverapp``, or ``flwr-simulation`` with Ray's driver inside) in a session
of its own, so stopping the SuperLink's process group does not reach it.

A process belongs to the run when its environment carries ``FEDSIM_RUN_TOKEN=TOKEN`` (inherited
from the launcher through SuperLink, ServerApp and Ray) or its working directory lies in the run's
WORKDIR (where the launcher starts everything). Both are needed: Ray's ``DashboardAgent`` and
``RuntimeEnvAgent`` overwrite their environment with their process title (it then shows no
token) and outlive the raylet by a minute or more; a process that changed directory still
carries the token. psutil reads both (and the command line) from the kernel.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil

from fedsim.runtime.flwr_cli import RUN_TOKEN_ENV as ENV_KEY

SERVER_APPS = {"flwr-serverapp", "flwr-simulation"}  # Flower's commands that run a ServerApp


def _belongs(proc: psutil.Process, token: str | None, root: str) -> bool:
    try:
        cwd = proc.cwd()
        if cwd == root or cwd.startswith(root + os.sep):
            return True
        return token is not None and proc.environ().get(ENV_KEY) == token
    except psutil.Error:  # gone, or not ours
        return False


def run_processes(root: str | Path, token: str | None = None, spare: int = -1) -> list[int]:
    """Pids (other than this one and ``spare``) working under ``root`` or carrying ``token``."""
    root = os.path.realpath(root)
    return [
        p.pid
        for p in psutil.process_iter()
        if p.pid not in (os.getpid(), spare) and _belongs(p, token, root)
    ]


def _runs_server_app(pid: int) -> bool:
    try:
        argv = psutil.Process(pid).cmdline()[:2]
    except psutil.Error:
        return False
    return any(os.path.basename(arg) in SERVER_APPS for arg in argv)


def _signal_and_wait(pids, sig: int, still, grace: float) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while still() and time.monotonic() < deadline:
        time.sleep(0.1)


def end_server_apps(root: str | Path, token: str | None = None, grace: float = 5.0) -> None:
    """SIGKILL the run's ServerApp processes and wait until they are gone: from then on nothing
    the rest of the run does while it stops can be journaled."""

    def server_apps() -> list[int]:
        return [pid for pid in run_processes(root, token) if _runs_server_app(pid)]

    _signal_and_wait(server_apps(), signal.SIGKILL, server_apps, grace)


def sweep(token: str, root: str, spare: int, grace: float = 5.0) -> None:
    end_server_apps(root, token)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_and_wait(
            run_processes(root, token, spare), sig, lambda: run_processes(root, token, spare), grace
        )


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    token, root, launcher = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.stdin.buffer.read()  # returns at EOF: the launcher closed the pipe or died
    sweep(token, root, launcher)


if __name__ == "__main__":
    main()
