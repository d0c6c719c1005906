"""A deployment's reply as the ServerApp pulls it (``fedsim/runtime/reply_pull.py``): the SuperLink
holds its record of the reply (the sender it checked: the node the message went to) apart from
the reply's objects, which the client wrote, metadata included. A client naming another node as
the sender in its reply's body, or another node's message as the one it answers, takes no other
node's place: its reply is counted ``malformed`` and the other node's reply stays its own."""

import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedsim.flower.grid import HttpGrid
from fedsim.flower.messages import (
    SUPERLINK_NODE_ID,
    ObjectTree,
    ProtoMessage,
    PullAppMessagesResponse,
    PullObjectResponse,
    Run,
    TaskIdentity,
    get_all_nested_objects,
    get_object_tree,
    metadata_to_proto,
)
from fedsim.runtime.message_metadata import set_message_id, set_src_node_id
from fedsim.runtime.messaging import ANY, Messenger, Policy
from fedsim.runtime.reply_pull import isolate_reply_pulls

HONEST, HOSTILE = 11, 22  # node ids
RUN = 7


@pytest.fixture(autouse=True)
def _server_app_identity(monkeypatch):
    """This process plays the run's ServerApp, as Flower's runtime tells it."""
    for name, value in (("_run_id", RUN), ("_node_id", SUPERLINK_NODE_ID), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


class SuperLink:
    """The ServerAppIo calls :func:`~fedsim.runtime.reply_pull.pull_each` makes, answered as Flower's
    SuperLink answers them: per reply, its record (the metadata the SuperLink stored, whose sender
    it checked to be the node the message went to: ``store_message_res``) and the objects the
    reply was sent as (Flower's own deflation of what the client returned, its metadata too)."""

    def __init__(self):
        self.records: dict[str, ProtoMessage] = {}  # the message a reply answers -> its record
        self.trees: dict[str, ObjectTree] = {}
        self.objects: dict[str, bytes] = {}

    def store(self, sent: Message, body: Message) -> None:
        record = body.metadata.__dict__ | {
            "_src_node_id": sent.metadata.dst_node_id,
            "_reply_to_message_id": sent.metadata.message_id,
            "_message_id": body.object_id,
        }
        metadata = type(body.metadata).__new__(type(body.metadata))
        metadata.__dict__.update(record)
        self.records[sent.metadata.message_id] = ProtoMessage(metadata=metadata_to_proto(metadata))
        self.trees[sent.metadata.message_id] = get_object_tree(body)
        self.objects |= {oid: obj.deflate() for oid, obj in get_all_nested_objects(body).items()}

    def PullMessages(self, request):  # noqa: N802 - Flower's names
        ids = [i for i in request.message_ids if i in self.records]
        return PullAppMessagesResponse(
            messages_list=[self.records.pop(i) for i in ids],
            message_object_trees=[self.trees.pop(i) for i in ids],
        )

    def PullObject(self, request):  # noqa: N802
        content = self.objects.get(request.object_id)
        return PullObjectResponse(
            object_found=content is not None,
            object_available=content is not None,
            object_content=content or b"",
        )

    def ConfirmMessageReceived(self, request):  # noqa: N802
        return None


class LinkedGrid(HttpGrid):
    """The ServerApp's HttpGrid on :class:`SuperLink`; each node answers as ``nodes`` (node id ->
    the reply's body, a function of the message) says."""

    def __init__(self, nodes: dict):
        super().__init__(token="token")
        self.link, self.nodes = SuperLink(), nodes
        self.set_run(Run.create_empty(run_id=RUN))

    @property
    def _runtime_client(self):
        return self.link

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        ids = []
        for i, msg in enumerate(messages):
            set_message_id(msg, f"sent-{i}")
            self.link.store(msg, self.nodes[msg.metadata.dst_node_id](msg))
            ids.append(msg.metadata.message_id)
        return ids


def _honest(msg: Message) -> Message:
    return Message(
        RecordDict({"metrics": MetricRecord({"node": msg.metadata.dst_node_id})}), reply_to=msg
    )


def _as_the_honest_node(msg: Message) -> Message:
    """The body names the honest node as its sender."""
    return set_src_node_id(_honest(msg), HONEST)


def _answering_the_honest_nodes_message(msg: Message) -> Message:
    """The body answers the message sent to the honest node, as the honest node."""
    reply = _as_the_honest_node(msg)
    reply.metadata.__dict__["_reply_to_message_id"] = "sent-0"
    return reply


@pytest.mark.parametrize(
    "forge",
    [_as_the_honest_node, _answering_the_honest_nodes_message],
    ids=["another sender", "another node's message"],
)
def test_a_reply_whose_body_claims_another_node_is_counted_and_the_other_node_keeps_its_reply(
    forge, caplog
):
    messenger = Messenger(
        isolate_reply_pulls(LinkedGrid({HONEST: _honest, HOSTILE: forge})),
        timeout=1,
        poll_seconds=0.0,
    )
    messages = [
        Message(
            RecordDict({"config": ConfigRecord()}), dst_node_id=n, message_type=MessageType.QUERY
        )
        for n in (HONEST, HOSTILE)
    ]
    replies = messenger.exchange("probe", messages, Policy(ANY))
    assert [(m.metadata.src_node_id, m.content["metrics"]["node"]) for m in replies] == [
        (HONEST, HONEST)
    ]
    counts = messenger.faults["probe"][1]
    assert (counts["accepted"], counts["malformed"], counts["timed_out"]) == (1, 1, 0)
    assert f"node {HOSTILE} rejected" in caplog.text  # the sender the SuperLink recorded
