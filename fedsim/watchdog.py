"""Kills a run's processes when ``fedsim run`` dies, however it dies (SIGKILL included).

``python -m fedsim.watchdog TOKEN LAUNCHER_PID`` runs in its own session with a pipe from the launcher on
stdin. A pipe reaches EOF when its writer closes it or dies, and the kernel closes it for a
killed process too: no polling, no parent-death signal (which only reaches direct children,
not the ServerApp and Ray processes the SuperLink spawns). Every process of the run carries
``FEDSIM_RUN_TOKEN=TOKEN`` in its environment (inherited from the launcher through SuperLink,
ServerApp and Ray), so on EOF the watchdog ends exactly those, sparing the launcher itself
(which may carry the token when its caller named it): SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

ENV_KEY = "FEDSIM_RUN_TOKEN"


def run_processes(token: str, spare: int = -1) -> list[int]:
    """Pids (other than this one and ``spare``) whose environment carries the run's token."""
    needle, pids = f"{ENV_KEY}={token}".encode(), []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in (os.getpid(), spare):
            continue
        try:
            if needle in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:  # gone, or not ours
            continue
    return pids


def sweep(token: str, spare: int, grace: float = 5.0) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in run_processes(token, spare):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while run_processes(token, spare) and time.monotonic() < deadline:
            time.sleep(0.2)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    token, launcher = sys.argv[1], int(sys.argv[2])
    sys.stdin.buffer.read()  # returns at EOF: the launcher closed the pipe or died
    sweep(token, launcher)


if __name__ == "__main__":
    main()
