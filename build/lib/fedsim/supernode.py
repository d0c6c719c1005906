"""``flower-supernode`` with shorter waits (``fedsim/flower_waits.py``: Flower 1.41 hard-codes
them, flwr/supernode/start_client_internal.py:263, :470, :506).

    python -m fedsim.supernode [--idle-wait S] [--reply-wait S] [--pull-backoff S] -- ARGS

ARGS are ``flower-supernode``'s own (TLS, node key, SuperLink...), passed through unchanged.
"""

from __future__ import annotations

import argparse
import sys

from flwr.supernode import start_client_internal
from flwr.supernode.cli import flower_supernode

from fedsim.flower_waits import Sleeps, shorten_pull_backoff


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fedsim.supernode", description=__doc__.splitlines()[0])
    parser.add_argument("--idle-wait", type=float, help="after a pull found no message (Flower: 3 s)")
    parser.add_argument("--reply-wait", type=float, help="between polls for the ClientApp's reply (0.5 s)")
    parser.add_argument("--pull-backoff", type=float, help="first retry of an object not there yet (1 s)")
    parser.add_argument("flower_args", nargs=argparse.REMAINDER, help="-- then flower-supernode's arguments")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    start_client_internal.time = Sleeps(args.idle_wait, args.reply_wait)
    if args.pull_backoff is not None:
        shorten_pull_backoff(args.pull_backoff)
    flower = [a for i, a in enumerate(args.flower_args) if i or a != "--"]
    sys.argv = ["flower-supernode", *flower]  # flower_supernode parses sys.argv
    flower_supernode()


if __name__ == "__main__":
    main()
