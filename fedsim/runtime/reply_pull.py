"""A deployment's replies pulled so that one a client made unreadable costs that reply only.

Flower's ``HttpGrid.pull_messages`` (flwr/superlink/grid/http_grid.py:304-382) asks the SuperLink
for the replies to the given ids, which the SuperLink deletes from its state as it answers
(flwr/superlink/servicer/runtime/runtime_handlers.py:215-228), then pulls and inflates each
reply with no guard around the inflation. A client can fill its reply's objects so that Flower's
own ``Array.inflate`` raises (a declared shape that is not integers, a chunk index out of
range): the call raises out of the exchange and ends the run, and every reply it had taken,
the honest ones included, is gone from the SuperLink. Flower has no
hook for it, so :func:`pull_each` takes Flower's steps per reply and makes a reply that does not
inflate an Error with ``MALFORMED_CODE`` (the Messenger counts it ``malformed``). A reply whose
objects never came stays Flower's ``MESSAGE_UNAVAILABLE`` Error. A Ray simulation's grid moves
Python objects, not bytes, and keeps its own pull.

A reply comes as the SuperLink's record of it (``PullMessages``: the metadata the SuperLink
stored, whose sender it checked to be the node the message went to) and as the reply's objects,
which its client wrote, metadata included. Flower's pull keeps the objects' metadata; a client
could name another node as the sender, or another node's message as the one it answers, and take
that node's place. Here a reply whose body disagrees with the record on who sent it to whom, in
answer to what, is an Error with ``MALFORMED_CODE``, and every Error names the record's sender.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import httpx
from flwr.app import Error, Message, Metadata
from flwr.common import now
from flwr.serverapp import Grid

from fedsim.flower.grid import HttpGrid
from fedsim.flower.messages import (
    SYSTEM_MESSAGE_TYPE,
    ConfirmMessageReceivedRequest,
    ErrorCode,
    ObjectPullError,
    PullAppMessagesRequest,
    inflate_object_from_contents,
    iterate_object_tree,
    make_message,
    make_pull_object_fn_protobuf,
    pull_objects,
)
from fedsim.runtime.sharded_grid import MALFORMED_CODE


def isolate_reply_pulls(grid: Grid) -> Grid:
    """``grid`` with :func:`pull_each` as its pull where it is a deployment's HttpGrid."""
    if isinstance(grid, HttpGrid):
        grid.pull_messages = partial(pull_each, grid)
    return grid


def pull_each(grid: HttpGrid, message_ids: Iterable[str]) -> list[Message]:
    """Flower's pull, each reply inflated on its own (see the module doc)."""
    client, run_id = grid._runtime_client, grid.run.run_id  # noqa: SLF001 - Flower's own client
    try:
        res = client.PullMessages(PullAppMessagesRequest(message_ids=list(message_ids)))
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code == httpx.codes.REQUEST_ENTITY_TOO_LARGE:
            return []  # as Flower: the replies stay at the SuperLink for the next, smaller pull
        raise
    return [
        _reply(grid, run_id, proto, tree)
        for proto, tree in zip(res.messages_list, res.message_object_trees, strict=True)
    ]


def _reply(grid: HttpGrid, run_id: int, proto, tree) -> Message:
    client, message_id = grid._runtime_client, proto.metadata.message_id  # noqa: SLF001
    try:
        contents = pull_objects(
            [t.object_id for t in iterate_object_tree(tree)],
            pull_object_fn=make_pull_object_fn_protobuf(client.PullObject, grid.node, run_id),
        )
    except ObjectPullError as exc:
        return _error(
            grid, run_id, proto, ErrorCode.MESSAGE_UNAVAILABLE, f"reply objects unavailable: {exc}"
        )
    client.ConfirmMessageReceived(
        ConfirmMessageReceivedRequest(node=grid.node, run_id=run_id, message_object_id=message_id)
    )
    try:
        message = inflate_object_from_contents(message_id, contents)
        if not isinstance(message, Message):
            raise TypeError(f"the reply inflates to a {type(message).__name__}, not a Message")
    except Exception as exc:  # noqa: BLE001 - whatever Flower's inflation raises on a client's bytes
        return _error(
            grid,
            run_id,
            proto,
            MALFORMED_CODE,
            f"unreadable reply: {type(exc).__name__}: {exc!s:.200}",
        )
    message.metadata.__dict__["_message_id"] = message_id
    if forged := _disagreement(message.metadata, proto.metadata):
        return _error(
            grid,
            run_id,
            proto,
            MALFORMED_CODE,
            f"its body disagrees with the SuperLink's record: {forged}",
        )
    return message


ROUTING = (
    "run_id",
    "src_node_id",
    "dst_node_id",
    "reply_to_message_id",
)  # who sent it to whom, answering what


def _disagreement(body: Metadata, record) -> str:
    """Where a reply's ``body`` (its client's words) and the SuperLink's ``record`` of it differ
    on :data:`ROUTING` ('' where they agree)."""
    return ", ".join(
        f"{field} {getattr(body, field)!r:.40} (recorded {getattr(record, field)!r:.40})"
        for field in ROUTING
        if getattr(body, field) != getattr(record, field)
    )


def _error(grid: HttpGrid, run_id: int, proto, code: int, reason: str) -> Message:
    """The Error reply Flower makes for a reply it could not pull, with ``code``, from the sender
    the SuperLink recorded (Flower names the ServerApp's own node: logs then blamed the server)."""
    return make_message(
        metadata=Metadata(
            run_id=run_id,
            message_id="",
            src_node_id=proto.metadata.src_node_id,
            dst_node_id=grid.node.node_id,
            message_type=SYSTEM_MESSAGE_TYPE,
            group_id="",
            ttl=0,
            reply_to_message_id=proto.metadata.reply_to_message_id,
            created_at=now().timestamp(),
        ),
        error=Error(code=code, reason=reason),
    )
