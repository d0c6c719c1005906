"""What every per-paper protocol shares: who the clients are, and the context a method runner
gets."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from omegaconf import DictConfig

from fedsim.messaging import Messenger, Policy


@dataclass
class RunContext:
    """What a method runner needs: messenger, config, nodes by partition and their info."""
    messenger: Messenger
    cfg: DictConfig
    base: dict             # the config entries every client message carries
    nodes: dict[int, int]  # partition id -> node id
    info: dict[int, dict]  # partition id -> the node's discovery info

    def partition_of(self, node: int) -> int:
        return next(pid for pid, n in self.nodes.items() if n == node)


def discover(messenger: Messenger, base: dict, config_key: str, info_key: str, partition_key: str
             ) -> tuple[dict[int, int], dict[int, ConfigRecord]]:
    """Every node's discovery reply (quorum: all; a method needs every client), by partition:
    node ids and the ``info_key`` record of each."""
    replies = messenger.exchange("discover", [
        Message(RecordDict({config_key: ConfigRecord(base)}), dst_node_id=n, message_type=MessageType.QUERY)
        for n in messenger.node_ids()], Policy())
    nodes, info = {}, {}
    for msg in replies:
        record = msg.content[info_key]
        pid = int(record[partition_key])
        nodes[pid], info[pid] = msg.metadata.src_node_id, record
    return nodes, info
