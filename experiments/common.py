"""What every per-paper protocol shares: who the clients are, and the context a method runner
gets."""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp.strategy import Result
from hydra.utils import instantiate
from omegaconf import DictConfig

from fedsim.messaging import ANY, Messenger, Policy
from fedsim.validators import model_reply


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

    def grid(self, label: str, policy: Policy | None = None):
        """A Grid over every client in partition order. Flower samples nodes by position and
        node ids are random per run, so this order makes the same seed sample the same clients
        in every run."""
        return self.messenger.grid(label, policy or Policy(ANY), [self.nodes[p] for p in sorted(self.nodes)])

    def fedavg(self, label: str, initial: ArrayRecord, rounds: int, config: dict,
               fraction_train: float, **strategy_args) -> Result:
        """The configured weight-averaging strategy (``strategy``, with ``strategy_args``) over
        ``fraction_train`` of the clients per round; replies need finite weights shaped as the
        model sent and a plausible weight, a round goes on with any of them."""
        strategy = instantiate(self.cfg.strategy, fraction_train=fraction_train, fraction_evaluate=0.0,
                               **strategy_args)
        return strategy.start(self.grid(label, Policy(ANY, model_reply(initial))), initial, rounds,
                              self.cfg.round_timeout, ConfigRecord(config))


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


def base_line(sft: dict) -> str:
    """One line on how a base language model was made (``tasks.causal_lm.saved_sft_base``)."""
    if not sft.get("steps"):
        return "Base: the model as published (no SFT)."
    return (f"Base: SFT on {sft['data']}, held-out nll {sft['heldout_nll_before']:.3f} -> "
            f"{sft['heldout_nll']:.3f}.")
