"""The two message fields fedsim writes that Flower 1.42 gives no setter.

``Metadata.message_id`` and ``Metadata.src_node_id`` are read-only properties over the
``_message_id`` and ``_src_node_id`` entries of the metadata's ``__dict__``
(flwr/app/metadata.py); Flower's own Grids and SuperLink write those entries directly (e.g.
flwr/superlink/grid/inmemory_grid.py). fedsim writes them here only, for these reasons:

- :func:`set_message_id`: a Grid gives every message it pushes an id, by which its reply is
  pulled. The in-process Grid and the sharded Grid are Grids of fedsim's, and the sharded
  ClientApp hands each logical client of a batch a message of its own, with an id of its own.
- :func:`set_src_node_id`: a resumed run's SuperNodes have new node ids; the messenger maps each
  reply's sender back to the journaled run's node id so the replay and the results agree.
"""

from __future__ import annotations

from flwr.app import Message


def set_message_id(msg: Message, message_id: str) -> Message:
    msg.metadata.__dict__["_message_id"] = message_id
    return msg


def set_src_node_id(msg: Message, node_id: int) -> Message:
    msg.metadata.__dict__["_src_node_id"] = node_id
    return msg
