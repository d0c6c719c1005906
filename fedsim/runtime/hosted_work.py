"""Work a SuperNode's hosted clients share (``hardware.client_backend: batched``): their local
training as one batched computation where their messages ask the same of each of them.

The ClientApp serves a batch client by client, each through the mods (``serve_batch`` in
``fedsim/runtime/sharded_grid.py``): every per-client check, fault and clipping stays each
client's own. Under the batched backend it also names the batch's clients here (:func:`batch`),
so that a handler whose training the task can run for many clients at once (the turn-sentiment
MLP's epochs, ``Recipe.local_updates``) asks :func:`result` for its own: the first client of a
run of peers computes theirs with it, ``chunk`` clients at a time, and each later one takes
what was computed for it. Peers are the batch's clients whose messages carry the very same
records (a broadcast: FedAvg's global model and config, packed once), so their work differs
by the partition alone; a client whose message a mod replaced computes its own, batched alone.
The batched computation must give a client the same result whoever shares it (turn sentiment:
every step over the batch size's rows, tested), so that a reply depends on the client, its
message and the seed, not on which SuperNode served it: a resumed run, whose clients may be
served elsewhere, ends where the uninterrupted one does. It equals the ``messages`` backend's
per-client computation (outside a batch) to float order.

Hand-written: Flower serves one message per call and knows nothing of peers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from itertools import islice
from typing import Any

from flwr.app import Message

CHUNK = 64  # clients a batched computation holds at once: memory is O(chunk x model)

_batch: ContextVar[_Batch | None] = ContextVar("fedsim_hosted_batch", default=None)


class _Batch:
    """The batch's clients in serving order, and the results computed for those not served yet."""

    def __init__(self, peers: list[tuple[Message, int]]):
        self.peers = peers
        self.position = {p: i for i, (_, p) in enumerate(peers)}
        self.results: dict[int, tuple[tuple, Any]] = {}  # partition -> (its inputs, result)


def inputs(msg: Message) -> tuple:
    """What a message asks of its client beside the partition: its type and record objects."""
    return (msg.metadata.message_type, *((name, id(r)) for name, r in msg.content.items()))


@contextmanager
def batch(peers: list[tuple[Message, int]]) -> Iterator[None]:
    """The clients (message, partition) a SuperNode is about to serve, in order; results not
    taken (a client that crashed before its handler) go with the batch."""
    token = _batch.set(_Batch(peers))
    try:
        yield
    finally:
        _batch.reset(token)


def result(
    partition: int,
    msg: Message,
    alone: Callable[[Message], Any],
    together: Callable[[Message, list[int]], list[Any]],
    chunk: int = CHUNK,
) -> Any:
    """Client ``partition``'s result for ``msg``: ``alone(msg)`` outside a batch; in one,
    computed for it with its next peers by ``together(msg, partitions)`` (one result per
    partition, in order), or computed earlier for it with a peer's identical message."""
    current = _batch.get()
    if current is None:
        return alone(msg)
    asked = inputs(msg)
    if partition in current.results and current.results[partition][0] == asked:
        return current.results.pop(partition)[1]
    later = current.peers[current.position.get(partition, len(current.peers)) + 1 :]
    peers = (p for m, p in later if p not in current.results and inputs(m) == asked)
    group = [partition, *islice(peers, chunk - 1)]
    computed = together(msg, group)
    current.results.update((p, (asked, r)) for p, r in zip(group[1:], computed[1:]))
    return computed[0]
