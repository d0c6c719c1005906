"""A Grid that delivers messages to handlers in this process, through Flower's protobuf wire
format: strategy-side tests and benchmarks see real message sizes and serialization cost
without a SuperLink, and can inspect everything the server received.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from uuid import uuid4

from flwr.app import Error, Message, RecordDict
from flwr.serverapp import Grid

from fedsim.flower.messages import ProtoMessage, TaskIdentity, message_from_proto, message_to_proto
from fedsim.runtime.message_metadata import set_message_id

Handler = Callable[[Message], RecordDict]  # raises = the ClientApp failed


def _encode(msg: Message) -> bytes:
    return message_to_proto(msg).SerializeToString()


def _decode(data: bytes) -> Message:
    return message_from_proto(ProtoMessage.FromString(data))


class InProcessGrid(Grid):
    """``handlers[node_id](message)`` answers at push time; a handler returning ``None`` never
    replies (a node that times out). ``client_wire_seconds``: the CPU seconds of the wire's
    client halves (decoding each message, encoding each reply), which a benchmark of the
    server's time takes out as it takes out the handlers'."""

    def __init__(self, handlers: dict[int, Handler], keep_replies: bool = True):
        self.handlers = handlers
        self.keep_replies = keep_replies
        self.received: list[Message] = []  # every reply the server got (if keep_replies)
        self.bytes_up = 0
        self.bytes_down = 0
        self.client_wire_seconds = 0.0
        self._run = None
        self._replies: dict[str, Message] = {}
        for name in ("run_id", "node_id", "task_id"):  # this process plays a run's ServerApp
            try:
                getattr(TaskIdentity, name)
            except RuntimeError:
                setattr(TaskIdentity, name, 0 if name != "run_id" else 1)

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(
            content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl
        )

    def get_node_ids(self) -> Iterable[int]:
        return list(self.handlers)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            set_message_id(msg, str(uuid4()))  # as Flower's InMemoryGrid
            data = _encode(msg)
            self.bytes_down += len(data)
            start = time.process_time()
            delivered = _decode(data)
            self.client_wire_seconds += time.process_time() - start
            try:
                content = self.handlers[msg.metadata.dst_node_id](delivered)
                reply = None if content is None else Message(content, reply_to=delivered)
            except Exception as exc:  # a crashing ClientApp: Flower replies with an error
                reply = Message(Error(code=0, reason=repr(exc)), reply_to=delivered)
            if reply is not None:
                start = time.process_time()
                data = _encode(reply)
                self.client_wire_seconds += time.process_time() - start
                decoded = _decode(data)
                self.bytes_up += len(data)
                self._replies[msg.metadata.message_id] = decoded
                if self.keep_replies:
                    self.received.append(decoded)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
