"""Many logical clients per SuperNode (``hardware.clients_per_supernode``), for every task.

Flower costs ~12 ms per message and node, whatever the message carries; a FedTP client's whole
work is a fraction of that. :class:`ShardedGrid` sits under the :class:`~fedsim.runtime.messaging.Messenger`
and shows the protocol and its strategies N logical clients (node ids ``1..N``, client ``l`` on
node id ``l + 1``), while Flower carries one message per SuperNode: client ``l`` lives on the
SuperNode whose partition is ``l mod K``. The messages a strategy sends to one SuperNode's
clients travel as one message (a record sent to several clients, such as FedAvg's global
model, only once), the ClientApp runs each client with its own partition id and the task's
client count (:func:`serve_batch`, the ClientApp's mods included), and its replies come back in
one message that this grid splits into one reply per client. Everything above sees one message
and one reply per client, so client-level semantics are unchanged: DPMean clips each client's
row, FedAvg weights each client's update, a client that raises is one ``failed`` reply; a
SuperNode that fails or times out counts once for each of its clients.

Flower Datasets' partitioners, the tasks' clients and their state are per logical client: the
ClientApp builds client ``l`` exactly as a SuperNode of its own would (``partition-id`` = ``l``,
``num-partitions`` = N).
"""

from __future__ import annotations

import heapq
import json
import logging
import math
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from copy import copy
from dataclasses import replace
from uuid import uuid4

from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedsim.flower.messages import make_message
from fedsim.message_keys import NODE_NUM_PARTITIONS, NODE_PARTITION_ID, NUM_EXAMPLES
from fedsim.runtime import hosted_work
from fedsim.runtime.journal import ask_partitions
from fedsim.runtime.message_metadata import set_message_id
from fedsim.runtime.row_batches import columns, split_rows, stack

log = logging.getLogger("fedsim")
SHARD = "fedsim-shard"  # the batch's manifest record
CLIENTS = "clients"  # logical partition ids in the batch, in order
NUM_CLIENTS = "num-clients"
LAYOUT = "layout"  # JSON: per client, its record names -> packed names; errors by index
REPLY_ROWS = "reply-rows"  # a request manifest: reply with stacked rows (row_batches.py)
ERROR_CODE = 0  # Flower's "unknown" error code for a logical client that raised
MALFORMED_CODE = (
    422  # an Error a grid makes for a reply it could not read: the Messenger counts it malformed
)


def pack(
    contents: list[RecordDict],
    clients: list[int],
    num_clients: int,
    errors: dict[int, str] | None = None,
    rows: bool = False,
) -> RecordDict:
    """One RecordDict for several clients' contents; a record object shared by several of them
    (a broadcast) is packed once. The manifest (``SHARD``) names the clients and, as one JSON
    string (thousands of per-client entries would cost more to check than to send), each
    client's record names and where they are packed, or its error. With ``rows`` the contents
    that stack are sent as rows of one array per key (``fedsim/runtime/row_batches.py``), the
    manifest's ``groups`` naming their clients; the others as above."""
    packed, single, groups = (
        stack(contents) if rows else (RecordDict(), list(range(len(contents))), [])
    )
    where, layout = {}, [{} for _ in contents]
    for i in single:
        content = contents[i]
        names = list(content.keys())
        for name in names:
            record = content[name]
            if id(record) not in where:
                where[id(record)] = f"r{len(where)}"
                packed[where[id(record)]] = record
        layout[i] = {name: where[id(content[name])] for name in names}
    return _manifested(packed, clients, num_clients, layout, errors, groups if rows else None)


def _manifested(
    packed: RecordDict,
    clients: list[int],
    num_clients: int,
    layout: list[dict],
    errors: dict[int, str] | None,
    groups: list[dict] | None,
) -> RecordDict:
    packed[SHARD] = ConfigRecord(
        {
            CLIENTS: clients,
            NUM_CLIENTS: num_clients,
            LAYOUT: json.dumps(
                {
                    "records": layout,
                    "errors": errors or {},
                    **({} if groups is None else {"groups": groups}),
                }
            ),
        }
    )
    return packed


def _layout(packed: RecordDict) -> dict:
    return json.loads(str(packed[SHARD][LAYOUT]))


def unpack(packed: RecordDict, layout: dict, i: int) -> RecordDict:
    """Client ``i``'s content of a :func:`pack`-ed RecordDict (``layout``: its manifest)."""
    return RecordDict({name: packed[where] for name, where in layout["records"][i].items()})


RowsReply = Callable[[Message, list[int], int, Context], "list | None"]


def serve_batch(
    msg: Message,
    context: Context,
    handler: Callable[[Message, Context], Message],
    rows_reply: RowsReply | None = None,
) -> Message:
    """ClientApp side: run ``handler`` (mods included) once per logical client of a batch, each
    with its own partition id, and pack the replies; a client that raises becomes an
    ``error/i`` entry (its own ``failed`` reply on the server), not the batch's failure. Under
    the batched backend the handlers may share their clients' work (``hosted_work.py``), and
    where every client gets the same message, ``rows_reply(message, clients, num_clients,
    context)`` may answer for all of them at once with their replies' columns
    (``row_batches.columns``), the very reply the clients one by one would give; None: it
    cannot, and they are served one by one."""
    manifest, layout = msg.content[SHARD], _layout(msg.content)
    clients, num_clients = list(manifest[CLIENTS]), int(manifest[NUM_CLIENTS])
    rows = bool(manifest.get(REPLY_ROWS, False))
    answered = (
        _as_rows(msg, layout, clients, num_clients, context, rows_reply)
        if rows and rows_reply is not None
        else None
    )
    if answered is not None:
        return answered
    subs = [_sub_message(msg, layout, i) for i in range(len(clients))]
    replies, errors = [], {}
    with hosted_work.batch(list(zip(subs, clients))) if rows else nullcontext():
        for i, (sub, client) in enumerate(zip(subs, clients)):
            sub_context = replace(
                context,
                node_config={
                    **context.node_config,
                    NODE_PARTITION_ID: client,
                    NODE_NUM_PARTITIONS: num_clients,
                },
            )
            try:
                replies.append(handler(sub, sub_context).content)
            except Exception as exc:  # noqa: BLE001 - one client's crash is its own failed reply
                errors[i] = f"{type(exc).__name__}: {exc}"
                replies.append(RecordDict())
    return Message(pack(replies, clients, num_clients, errors, rows), reply_to=msg)


def _as_rows(
    msg: Message,
    layout: dict,
    clients: list[int],
    num_clients: int,
    context: Context,
    rows_reply: RowsReply,
) -> Message | None:
    """The batch's reply from its clients' columns, where they all got the same records and
    ``rows_reply`` gives them; None: served one by one (also where it raised: each client's
    own error is then its own reply, as one by one)."""
    if any(r != layout["records"][0] for r in layout["records"]):
        return None
    try:
        records = rows_reply(_sub_message(msg, layout, 0), clients, num_clients, context)
        if records is None:
            return None
        packed, group = columns(records, len(clients))
    except Exception as exc:  # noqa: BLE001 - served one by one, each client's error its own
        log.warning(
            "the batch's clients as rows: %s: %s; served one by one", type(exc).__name__, exc
        )
        return None
    unstacked = [{} for _ in clients]  # every client's reply is in the group
    return Message(
        _manifested(packed, clients, num_clients, unstacked, None, [group]), reply_to=msg
    )


def _sub_message(msg: Message, layout: dict, i: int) -> Message:
    """Client ``i``'s message of a batch, as if sent on its own."""
    sub = make_message(copy(msg.metadata), unpack(msg.content, layout, i))
    set_message_id(sub, f"{msg.metadata.message_id}/{i}")
    return sub


def _parts(content: RecordDict, clients: list[int]) -> list[RecordDict | Error]:
    """Each client's reply in a batch reply: its content, its error, or a malformed-reply
    error when its part cannot be read (all of them when the manifest does not answer exactly
    the clients sent, in order: parts could not be told apart)."""
    try:
        manifest = content[SHARD]
        layout = json.loads(str(manifest[LAYOUT]))
        answered, records, errors = (
            [int(c) for c in manifest[CLIENTS]],
            layout["records"],
            layout["errors"],
        )
    except Exception as exc:  # noqa: BLE001 - whatever the SuperNode sent (a nesting too deep for json: RecursionError)
        return [
            Error(MALFORMED_CODE, f"unreadable batch manifest: {type(exc).__name__}: {exc!s:.200}")
        ] * len(clients)
    if (
        answered != clients
        or not isinstance(records, list)
        or len(records) != len(clients)
        or not isinstance(errors, dict)
    ):
        why = f"batch answers clients {answered!s:.200} with {records!s:.200}; sent to {clients}"
        return [Error(MALFORMED_CODE, why)] * len(clients)
    stacked = split_rows(content, layout.get("groups") or []) if isinstance(layout, dict) else {}
    return [
        _stacked_part(stacked[i], i) if i in stacked else _part(content, layout, i)
        for i in range(len(clients))
    ]


def _stacked_part(part: RecordDict | str, i: int) -> RecordDict | Error:
    if isinstance(part, str):
        return Error(MALFORMED_CODE, f"client part {i}: {part}")
    return part


def _part(content: RecordDict, layout: dict, i: int) -> RecordDict | Error:
    try:
        return _read_part(content, layout, i)
    except Exception as exc:  # noqa: BLE001 - whatever the SuperNode sent
        return Error(
            MALFORMED_CODE, f"client part {i} of the batch is unreadable: {type(exc).__name__}"
        )


def _read_part(content: RecordDict, layout: dict, i: int) -> RecordDict | Error:
    if str(i) in layout["errors"]:
        return Error(ERROR_CODE, str(layout["errors"][str(i)]))
    names = layout["records"][i]
    if not isinstance(names, dict) or not all(
        isinstance(w, str) and w in content and w != SHARD for w in names.values()
    ):
        return Error(MALFORMED_CODE, f"client part {i} of the batch names records it does not hold")
    return unpack(content, layout, i)


def logical_node_id(partition: int) -> int:
    return partition + 1


def logical_partition(node_id: int) -> int:
    return node_id - 1


class ShardedGrid(Grid):
    """``num_clients`` logical clients over the SuperNodes of ``grid`` (see the module doc)."""

    def __init__(
        self,
        grid: Grid,
        num_clients: int,
        timeout: float = 600.0,
        poll: float = 0.2,
        reply_rows: bool = False,
        balance: bool = False,
    ):
        self.raw, self.num_clients, self.reply_rows = grid, num_clients, reply_rows
        self.balance = balance  # each exchange's clients spread over the SuperNodes by load
        self.load: dict[int, float] = {}  # logical node id -> its last reply's examples
        # a SuperNode left out hosts none
        partitions, _, self.ray_nodes = ask_partitions(grid, timeout, poll)
        if not partitions:
            raise RuntimeError("ShardedGrid: no SuperNode told its partition")
        hosts = sorted(partitions, key=partitions.get)  # the SuperNodes in partition order
        if len(hosts) > num_clients:
            raise ValueError(
                f"{len(hosts)} SuperNodes for {num_clients} clients: some would host none"
            )
        self.host = {logical_node_id(p): hosts[p % len(hosts)] for p in range(num_clients)}
        self._sent: dict[str, Message] = {}  # logical message id -> the message
        self._batch_of: dict[str, str] = {}  # logical message id -> its batch's id
        self._batches: dict[str, list[str]] = {}  # batch id -> its logical message ids
        self._replies: dict[str, Message] = {}  # logical message id -> its reply

    def get_node_ids(self) -> Iterable[int]:
        return list(self.host)

    def placed(self) -> dict[int, int]:
        """Each logical client's node id -> its partition: the server placed it, so a whoami reply
        naming another (its SuperNode's words) is refused."""
        return {node: logical_partition(node) for node in self.host}

    def hosted(self) -> tuple[dict[int, int], dict[str, int], dict[str, int]]:
        """What :func:`ask_partitions` would learn by asking every logical client, known without
        a message per client (``hardware.client_backend: batched``): each client's partition is
        where the server placed it, on a SuperNode that told its own partition at the start.
        The Ray nodes count the SuperNodes each served."""
        n = len(self.host)
        counts = {"sent": n, "failed": 0, "malformed": 0, "duplicate": 0, "timed_out": 0}
        return self.placed(), counts | {"accepted": n}, dict(self.ray_nodes)

    def one_per_supernode(self, nodes: Iterable[int]) -> list[int]:
        """The first of ``nodes`` hosted on each SuperNode: a message about the SuperNode's
        machine, not its clients (the run's client state, one folder per run), needs no more."""
        first: dict[int, int] = {}
        for node in nodes:
            first.setdefault(self.host[node], node)
        return list(first.values())

    def servers(self, nodes: list[int]) -> dict[int, int]:
        """The SuperNode serving each of ``nodes`` in one exchange: its host, or with ``balance``
        (a simulation, where any SuperNode can build any client: data and state are the
        machine's) the least loaded SuperNode so far, the heaviest clients placed first (a
        load is the examples of the client's last reply, the mean of the known ones before it
        replied): a round's sample waits on no SuperNode holding most of it. Which SuperNode
        serves a client changes no reply (a client is built and seeded by its partition)."""
        if not self.balance:
            return {node: self.host[node] for node in nodes}
        known = self.load.values()
        default = sum(known) / len(known) if known else 1.0
        weight = {node: self.load.get(node, default) for node in nodes}
        heap = [(0.0, host) for host in sorted(set(self.host.values()))]
        servers = {}
        for node in sorted(nodes, key=lambda n: (-weight[n], n)):
            load, host = heapq.heappop(heap)
            servers[node] = host
            heapq.heappush(heap, (load + weight[node], host))
        return servers

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        groups: dict[tuple[int, str], list[Message]] = {}
        ids = []
        messages = list(messages)
        servers = self.servers([m.metadata.dst_node_id for m in messages])
        for msg in messages:
            set_message_id(msg, uuid4().hex)
            self._sent[msg.metadata.message_id] = msg
            groups.setdefault(
                (servers[msg.metadata.dst_node_id], msg.metadata.message_type), []
            ).append(msg)
            ids.append(msg.metadata.message_id)
        batches, members = [], []
        for (host, message_type), group in groups.items():
            content = pack(
                [m.content for m in group],
                [logical_partition(m.metadata.dst_node_id) for m in group],
                self.num_clients,
            )
            if self.reply_rows:  # hardware.client_backend: batched
                content[SHARD][REPLY_ROWS] = True
            batches.append(Message(content, dst_node_id=host, message_type=message_type))
            members.append([m.metadata.message_id for m in group])
        for batch_id, group_ids in zip(self.raw.push_messages(batches), members):
            self._batches[batch_id] = group_ids
            self._batch_of.update((i, batch_id) for i in group_ids)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies of ``message_ids`` that have come. Every open batch is pulled (a reply
        nobody asked for yet waits in ``_replies``) and the ids are read only while replies
        wait: a poll costs O(SuperNodes), not O(clients) (at 100,000 clients, polled every 0.1
        s, reading every pending id per poll was a quadratic share of the round)."""
        if self._batches:
            for reply in self.raw.pull_messages(list(self._batches)):
                self._split(reply)
        if not self._replies:
            return []
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def _split(self, reply: Message) -> None:
        """One reply per logical client of a batch reply (errors stay each client's own). A
        SuperNode runs code the server does not control: a batch it answers with a missing,
        extra or unreadable client part becomes a ``malformed`` reply for each client it
        cannot be split for, not the run's crash."""
        group = self._batches.pop(reply.metadata.reply_to_message_id)
        sent = [self._sent.pop(message_id) for message_id in group]
        for message_id in group:
            del self._batch_of[message_id]
        if reply.has_error():
            error = Error(reply.error.code, f"its SuperNode failed: {reply.error.reason}")
            parts = [error] * len(sent)
        else:
            parts = _parts(reply.content, [logical_partition(m.metadata.dst_node_id) for m in sent])
        for message_id, msg, part in zip(group, sent, parts):
            self._replies[message_id] = Message(part, reply_to=msg)
            if self.balance and isinstance(part, RecordDict):
                self._learn_load(msg.metadata.dst_node_id, part)

    def _learn_load(self, node: int, part: RecordDict) -> None:
        """The client's examples (its reply's ``num-examples``, where a finite positive number)
        as its load estimate."""
        for record in part.values():
            examples = record.get(NUM_EXAMPLES) if isinstance(record, MetricRecord) else None
            if isinstance(examples, (int, float)) and 0 < examples < math.inf:
                self.load[node] = float(examples)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        raise NotImplementedError("a ShardedGrid is driven by its Messenger (push / pull)")

    def set_run(self, run) -> None:
        self.raw.set_run(run)

    @property
    def run(self):
        return self.raw.run

    def create_message(self, *args, **kwargs) -> Message:
        return self.raw.create_message(*args, **kwargs)
