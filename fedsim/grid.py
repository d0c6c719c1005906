"""A Grid view that limits the visible nodes and reports progress while it waits for replies.

Strategies sample from ``grid.get_node_ids()``; a protocol that gives one population to the
strategy (e.g. the prior clients) and another to evaluation wraps the run's Grid in this view.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

log = logging.getLogger("fedsim")


class ProgressGrid(Grid):
    """Delegates to ``grid``; ``node_ids`` (if given) is the population the caller may use."""

    def __init__(self, grid: Grid, node_ids: Iterable[int] | None = None, label: str = "",
                 poll_seconds: float = 1.0, report_seconds: float = 10.0):
        self._grid = grid
        self._nodes = None if node_ids is None else list(node_ids)
        self.label = label
        self.poll_seconds = poll_seconds
        self.report_seconds = report_seconds

    def subset(self, node_ids: Iterable[int], label: str) -> "ProgressGrid":
        return ProgressGrid(self._grid, node_ids, label, self.poll_seconds, self.report_seconds)

    def set_run(self, run) -> None:
        self._grid.set_run(run)

    @property
    def run(self):
        return self._grid.run

    def create_message(self, *args, **kwargs) -> Message:
        return self._grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._grid.get_node_ids()) if self._nodes is None else list(self._nodes)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self._grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        """Same contract as Flower's (replies that arrived before ``timeout``), with progress."""
        pending = set(self.push_messages(messages))
        total, replies = len(pending), []
        start = last = time.monotonic()
        while pending and (timeout is None or time.monotonic() - start < timeout):
            got = list(self.pull_messages(list(pending)))
            replies.extend(got)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            now = time.monotonic()
            if pending and now - last >= self.report_seconds:
                log.info("[%s] %d/%d clients done, %.0f s elapsed", self.label or "round",
                         total - len(pending), total, now - start)
                last = now
            if pending:
                time.sleep(self.poll_seconds)
        log.info("[%s] %d/%d replies in %.1f s%s", self.label or "round", len(replies), total,
                 time.monotonic() - start, f" ({len(pending)} timed out)" if pending else "")
        return replies
