"""A Message's wire form and the transfer of its objects: Flower's private names any fedsim process
uses (``flwr.app`` imports all of them but the Runtime API's protobufs, so this module costs nothing more)."""

# A Message with the metadata the SuperLink stored (a reply pull's Error, a shard's forwarded reply).
from flwr.app.message import make_message

# Flower's Error codes (MESSAGE_UNAVAILABLE), the SuperLink's node id on a reply addressed to it, and an
# Array's serialization types (a reply array read in place only when it is Flower's numpy form).
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode, SType

# The journal and the in-process grid store and copy a Message as Flower's own protobuf bytes.
from flwr.common.serde import message_from_proto, message_to_proto, metadata_to_proto

# The protobufs of the Runtime API's reply pull, object pull and confirmation (reply_pull, its tests), and
# of a SuperNode as the SuperLink lists it, its public key included (the reply attacks' grid).
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, ObjectTree, PullObjectResponse
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.proto.node_pb2 import NodeInfo
from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullAppMessagesResponse

# The module of the object pull's backoff defaults (PULL_MAX_TRIES_PER_OBJECT, PULL_BACKOFF_CAP) fedsim scales.
from flwr.supercore import constant

# The message type of Flower's own Errors, so a reply pull's Error reads as Flower's.
from flwr.supercore.constant import SYSTEM_MESSAGE_TYPE

# The module whose pull functions' keyword defaults (the backoff) flower_waits shortens.
from flwr.supercore.inflatable import inflatable_utils

# A reply's objects pulled and inflated one reply at a time (reply_pull), and built for its tests.
from flwr.supercore.inflatable.inflatable_object import (
    get_all_nested_objects,
    get_object_tree,
    iterate_object_tree,
)
from flwr.supercore.inflatable.inflatable_protobuf_utils import make_pull_object_fn_protobuf
from flwr.supercore.inflatable.inflatable_utils import (
    ObjectPullError,
    ObjectUnavailableError,
    inflate_object_from_contents,
    pull_objects,
)

# A SuperNode's public key in the form the SuperLink stores (the reply attacks' grid).
from flwr.supercore.primitives.asymmetric import public_key_to_bytes

# The run a grid serves (an HttpGrid built in tests without a SuperLink).
from flwr.supercore.run import Run

# The task a Message belongs to, which Flower stamps on every Message: code that builds Messages outside
# a run (tests, bench) sets it as Flower's process would.
from flwr.supercore.task_identity import TaskIdentity
