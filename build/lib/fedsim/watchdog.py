"""Kills a run's processes when ``fedsim run`` dies, however it dies (SIGKILL included).

``python -m fedsim.watchdog TOKEN WORKDIR LAUNCHER_PID`` runs in its own session with a pipe from
the launcher on stdin. A pipe reaches EOF when its writer closes it or dies, and the kernel closes
it for a killed process too: no polling, no parent-death signal (which only reaches direct
children, not the ServerApp and Ray processes the SuperLink spawns). On EOF the watchdog ends
every process of the run, sparing the launcher: SIGTERM, then SIGKILL.

A process belongs to the run when its environment carries ``FEDSIM_RUN_TOKEN=TOKEN`` (inherited
from the launcher through SuperLink, ServerApp and Ray) or its working directory lies in the run's
WORKDIR (where the launcher starts everything). Both are needed: Ray's ``DashboardAgent`` and
``RuntimeEnvAgent`` overwrite their environment with their process title (``/proc/PID/environ``
then shows no token) and outlive the raylet by a minute or more; a process that changed directory
still carries the token.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

ENV_KEY = "FEDSIM_RUN_TOKEN"


def _belongs(proc: Path, needle: bytes | None, root: str) -> bool:
    try:
        cwd = os.readlink(proc / "cwd")
        if cwd == root or cwd.startswith(root + os.sep):
            return True
        return needle is not None and needle in (proc / "environ").read_bytes().split(b"\0")
    except OSError:  # gone, or not ours
        return False


def run_processes(root: str | Path, token: str | None = None, spare: int = -1) -> list[int]:
    """Pids (other than this one and ``spare``) working under ``root`` or carrying ``token``."""
    needle = f"{ENV_KEY}={token}".encode() if token else None
    root = os.path.realpath(root)
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and int(p.name) not in (os.getpid(), spare)
            and _belongs(p, needle, root)]


def sweep(token: str, root: str, spare: int, grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in run_processes(root, token, spare):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while run_processes(root, token, spare) and time.monotonic() < deadline:
            time.sleep(0.2)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    token, root, launcher = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.stdin.buffer.read()  # returns at EOF: the launcher closed the pipe or died
    sweep(token, root, launcher)


if __name__ == "__main__":
    main()
