"""``flower-supernode`` with shorter waits (``fedsim/runtime/flower_waits.py``: Flower 1.42 hard-codes
them, flwr/supernode/start_client_internal.py:263, :470, :506) and warm ClientApp processes.

    python -m fedsim.run.supernode [--idle-wait S] [--reply-wait S] [--pull-backoff S] \
        [--preload MOD,MOD... [--workers N]] -- ARGS

ARGS are ``flower-supernode``'s own (TLS, node key, SuperLink...), passed through unchanged.
``--preload``: the SuperNode's SuperExec (which it starts in ``--isolation subprocess``, with
Flower's arguments) is ``fedsim.run.superexec``, whose ClientApp processes fork from a process that
imported these modules once; ``--workers``: that many of them per run serve its messages one
after another (``fedsim/run/clientapp_workers.py``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from fedsim.flower.processes import flower_supernode, start_client_internal
from fedsim.runtime.flower_waits import Sleeps, shorten_pull_backoff


def after_separator(remainder: list[str]) -> list[str]:
    """The wrapped Flower command's arguments: argparse's REMAINDER keeps the leading ``--``."""
    return remainder[1:] if remainder[:1] == ["--"] else remainder


class WarmSuperExec:
    """Stands in for ``subprocess`` in start_client_internal, whose one call starts
    ``flower-superexec``: the same arguments go to ``fedsim.run.superexec``."""

    def __init__(self, preload: str, pull_backoff: float | None, workers: int = 0):
        self.options = (
            [f"--preload={preload}"]
            + ([] if pull_backoff is None else [f"--pull-backoff={pull_backoff}"])
            + ([f"--workers={workers}"] if workers else [])
        )

    def Popen(self, command: list[str], **kwargs):  # noqa: N802 (subprocess's name)
        assert command[0] == "flower-superexec", (
            command
        )  # a Flower upgrade that adds a call fails here
        warm = [sys.executable, "-m", "fedsim.run.superexec", *self.options, "--", *command[1:]]
        return subprocess.Popen(warm, **kwargs)  # pylint: disable=consider-using-with


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m fedsim.run.supernode", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--idle-wait", type=float, help="after a pull found no message (Flower: 3 s)"
    )
    parser.add_argument(
        "--reply-wait", type=float, help="between polls for the ClientApp's reply (0.5 s)"
    )
    parser.add_argument(
        "--pull-backoff", type=float, help="first retry of an object not there yet (1 s)"
    )
    parser.add_argument(
        "--preload", help="modules the warm ClientApp process imports (fedsim/run/superexec.py)"
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="ClientApp processes per run that serve its messages"
    )
    parser.add_argument(
        "flower_args", nargs=argparse.REMAINDER, help="-- then flower-supernode's arguments"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    start_client_internal.time = Sleeps(args.idle_wait, args.reply_wait)
    if args.pull_backoff is not None:
        shorten_pull_backoff(args.pull_backoff)
    if args.preload is not None:
        start_client_internal.subprocess = WarmSuperExec(
            args.preload, args.pull_backoff, args.workers
        )
    sys.argv = [
        "flower-supernode",
        *after_separator(args.flower_args),
    ]  # flower_supernode parses sys.argv
    flower_supernode()


if __name__ == "__main__":
    main()
