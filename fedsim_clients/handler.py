"""The base of every ClientApp handler: what every method's client does the same way.

The ClientApp (``fedsim/runtime/client_app.py``) builds the task's handler once per process and hands it
each message (``handle``): the base dispatches by message type, answers discovery with the
partition the node was given (the one it told the Messenger at ``whoami``, which the server
holds the reply to: ``fedsim.runtime.validators.discovery_reply``) and the method's own fields
(``discover``), and reads the keys every method shares (``fedsim/message_keys.py``: round, seed,
threads, the weights sent and replied). A method's handler keeps only its task's work. HE is not
here: ``fedsim/runtime/he_layer.py`` wraps any handler that exchanges weights (``initial_weights``).
"""

from __future__ import annotations

import os

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedsim.message_keys import (
    ARRAYS,
    INFO,
    METRICS,
    PARTITION_ID,
    SEED,
    SERVER_ROUND,
    TORCH_THREADS,
)
from fedsim.runtime.records import from_record, to_record
from fedsim.seeding import Stream


class ClientHandler:
    """One logical client of a task: partition ``partition_id`` of ``num_partitions``."""

    def __init__(self, task: dict, data_root: str, partition_id: int, num_partitions: int):
        self.task, self.data_root = task, data_root
        self.partition_id, self.num_partitions = partition_id, num_partitions

    def handle(self, msg: Message) -> RecordDict:
        """The reply's content: the handler of the message's type."""
        handlers = {
            MessageType.QUERY: self.query,
            MessageType.TRAIN: self.train,
            MessageType.EVALUATE: self.evaluate,
        }
        return handlers[msg.metadata.message_type](msg)

    def query(self, msg: Message) -> RecordDict:
        """Discovery: the node's partition and what the method declares of its data."""
        return RecordDict(
            {INFO: ConfigRecord({PARTITION_ID: self.partition_id, **self.discover()})}
        )

    def discover(self) -> dict:
        """The method's discovery fields (what the public partitioning gives this partition)."""
        return {}

    def train(self, msg: Message) -> RecordDict:
        raise ValueError(f"{type(self).__name__} answers no train messages")

    def evaluate(self, msg: Message) -> RecordDict:
        raise ValueError(f"{type(self).__name__} answers no evaluate messages")

    @classmethod
    def train_rows(
        cls, task: dict, data_root: str, partitions: list[int], num_partitions: int, msg: Message
    ) -> list | None:
        """The train replies of the clients ``partitions``, all sent ``msg``, as columns (one
        ``(record name, kind, {key: one row per client})`` per record of a reply,
        ``fedsim/runtime/row_batches.py``'s ``columns``): what each client's ``train`` returns,
        computed without a client object or reply per client (a SuperNode hosting thousands
        under ``hardware.client_backend: batched``). None: served client by client."""
        return None

    def initial_weights(self, msg: Message) -> dict[str, np.ndarray]:
        """The common weights a training of ``msg`` starts from before any aggregate (HE's round 0:
        the server holds no model); a handler that HE may wrap says which."""
        raise ValueError(f"{type(self).__name__} names no initial weights: HE cannot wrap it")

    @staticmethod
    def server_round(config: ConfigRecord, default: int = 0) -> int:
        return int(config.get(SERVER_ROUND, default))

    def seed(self, of: Stream, config: ConfigRecord, **more) -> int:
        """The seed of stream ``of`` for this client in the message's round (``more``: its other keys)."""
        return of.seed(
            config[SEED], round=self.server_round(config), partition=self.partition_id, **more
        )

    @staticmethod
    def threads(config: ConfigRecord) -> int:
        """torch's threads as the message asks (clients share the machine); torch is imported here,
        not at module level: a handler that trains nothing never loads it."""
        import torch

        torch.set_num_threads(int(config.get(TORCH_THREADS, 0)) or os.cpu_count() or 1)
        return torch.get_num_threads()

    @staticmethod
    def weights(msg: Message) -> dict[str, np.ndarray]:
        """The weights the message carries."""
        return from_record(msg.content[ARRAYS])

    @staticmethod
    def weights_reply(weights: dict[str, np.ndarray], metrics: dict) -> RecordDict:
        """A train reply: the trained weights and their metrics."""
        return RecordDict({ARRAYS: to_record(weights), METRICS: MetricRecord(metrics)})
