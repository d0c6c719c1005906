"""A Grid that delivers messages to handlers in this process, through Flower's protobuf wire
format: strategy-side tests and benchmarks see real message sizes and serialization cost
without a SuperLink, and can inspect everything the server received.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import Error, Message, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

Handler = Callable[[Message], RecordDict]  # raises = the ClientApp failed


class InProcessGrid(Grid):
    def __init__(self, handlers: dict[int, Handler], keep_replies: bool = True):
        self.handlers = handlers
        self.keep_replies = keep_replies
        self.received: list[Message] = []  # every reply the server got (if keep_replies)
        self.bytes_up = 0
        self.bytes_down = 0
        self._run = None
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
        return Message(content, dst_node_id=dst_node_id, message_type=message_type,
                       group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.handlers)

    def push_messages(self, messages):
        raise NotImplementedError("InProcessGrid answers through send_and_receive")

    def pull_messages(self, message_ids):
        raise NotImplementedError("InProcessGrid answers through send_and_receive")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        replies = []
        for msg in messages:
            wire = message_to_proto(msg).SerializeToString()
            self.bytes_down += len(wire)
            delivered = message_from_proto(ProtoMessage.FromString(wire))
            try:
                reply = Message(self.handlers[msg.metadata.dst_node_id](delivered),
                                reply_to=delivered)
            except Exception as exc:  # a crashing ClientApp: Flower replies with an error
                reply = Message(Error(code=0, reason=repr(exc)), reply_to=delivered)
            wire = message_to_proto(reply).SerializeToString()
            self.bytes_up += len(wire)
            decoded = message_from_proto(ProtoMessage.FromString(wire))
            if self.keep_replies:
                self.received.append(decoded)
            replies.append(decoded)
        return replies
