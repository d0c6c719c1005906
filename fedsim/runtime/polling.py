"""How long the server waits between two pulls of replies.

A fixed interval makes every exchange wait half of it on average after its last reply came
(0.1 s: Flower's own grids poll at that rate). What a pull costs decides what a shorter
interval costs: a Ray simulation's in-memory pull of a few pending replies takes tens of
microseconds, a deployment's is a network round trip of milliseconds. So the pause after a
pull is :data:`PAUSE_PER_PULL` times what an empty pull took (polling keeps at most ~5% of the
server's thread), never more than the run's ``ceiling``: in a simulation a reply is pulled a
few milliseconds after it arrives, over a network as before. A pull that brought replies also
paid for reading them, so it does not set the pace.

The SuperLink answers every pull too, so a wait that has lasted a while polls less: the pause
is at least :data:`WAITED_SHARE` of the time waited so far (a reply then waits at most ~5% of
the exchange's length more), which brings a long exchange (minutes of training) back to the
ceiling within its first seconds instead of pulling hundreds of times a second throughout.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

PAUSE_PER_PULL = 20.0  # seconds paused per second a pull took: polling costs <= 1/21 of a thread
WAITED_SHARE = 0.05  # the pause is at least this share of the time waited so far


class Poller:
    """Pulls replies and paces the pulls of one wait."""

    def __init__(self, ceiling: float, clock: Callable[[], float] = time.monotonic):
        self.ceiling, self.clock = ceiling, clock
        self.started = clock()
        self.cost: float | None = None  # the last empty pull's seconds (the first pull's before)

    def pull(self, pull_messages: Callable[[list[str]], Iterable], pending: Iterable[str]) -> list:
        started = self.clock()
        got = list(pull_messages(list(pending)))
        if not got or self.cost is None:
            self.cost = self.clock() - started
        return got

    def seconds(self) -> float:
        """The pause before the next pull."""
        waited = self.clock() - self.started
        return min(self.ceiling, max(PAUSE_PER_PULL * (self.cost or 0.0), WAITED_SHARE * waited))

    def pause(self) -> None:
        time.sleep(self.seconds())
