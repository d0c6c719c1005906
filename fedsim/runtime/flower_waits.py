"""Flower 1.42's fixed waits on a deployment's message path, shortened where fedsim runs them.

Flower's polls alone cost each exchange of a deployment ~2.5 s on average (docs/deploy.md,
Flower's waits on the message path). Flower has a setting for one of them, the SuperExec's
task poll (:data:`SUPEREXEC_POLL_ENV`, flwr/supercore/superexec/run_superexec.py:48-85), which
the launcher sets in each SuperNode's environment. The others have no flag or variable, so they
are changed in the processes fedsim starts:

- the SuperNode's ``time.sleep(3)`` after a pull that found no message and its 0.5 s polls for
  the ClientApp's reply (flwr/supernode/start_client_internal.py:263, :470, :506): ``python -m
  fedsim.run.supernode`` runs ``flower-supernode`` with that module's sleeps mapped (:class:`Sleeps`);
- the retry of an object pulled before its upload completed, 1 s doubling to 10 s
  (flwr/supercore/inflatable/inflatable_utils.py:201-276, keyword defaults from
  flwr/supercore/constant.py:46-49), in the ServerApp and the SuperNode
  (:func:`shorten_pull_backoff`).
"""

from __future__ import annotations

import time

SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
IDLE_SLEEP, REPLY_SLEEP = 3, 0.5  # the literals of start_client_internal.py:263 and :470 / :506
BACKOFF_CAP = 1.0  # seconds; Flower's cap is 10


def shorten_pull_backoff(first: float) -> None:
    """Object pulls retry after ``first`` seconds, doubling to :data:`BACKOFF_CAP`. Flower's
    tries per object grow by as much as its cap shrinks, so a pull gives up no sooner than
    before. Both functions' keyword defaults are patched: each module imports them by name.
    Flower is imported here, not above: the launcher imports this module and stays without it."""
    from fedsim.flower.messages import constant, inflatable_utils

    tries = int(constant.PULL_MAX_TRIES_PER_OBJECT * constant.PULL_BACKOFF_CAP / BACKOFF_CAP)
    for fn in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        fn.__kwdefaults__.update(
            initial_backoff=first, backoff_cap=BACKOFF_CAP, max_tries_per_object=tries
        )


class Sleeps:
    """Stands in for ``time`` in start_client_internal: its literal sleeps become ``idle`` and
    ``reply`` (None keeps Flower's), anything else is the real ``time``."""

    def __init__(self, idle: float | None, reply: float | None):
        self.waits = {IDLE_SLEEP: idle, REPLY_SLEEP: reply}

    def sleep(self, seconds: float) -> None:
        wait = self.waits.get(seconds)
        time.sleep(seconds if wait is None else wait)

    def __getattr__(self, name: str):
        return getattr(time, name)
