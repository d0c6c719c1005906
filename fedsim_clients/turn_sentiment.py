"""Turn sentiment's client: one local epoch of the workload's MLP on its slice of turns
(``fedsim_tasks/topical_chat/turn_sentiment.py``), the weights and its examples back."""

from __future__ import annotations

import numpy as np
from flwr.app import Message, RecordDict

from fedsim.runtime import hosted_work
from fedsim.runtime.hosted_work import CHUNK
from fedsim.runtime.row_batches import ARRAY, METRIC
from fedsim_clients import turn_sentiment_messages as keys
from fedsim_clients.handler import ClientHandler
from fedsim_tasks.proximal import proximal_mu
from fedsim_tasks.topical_chat.turn_sentiment import WEIGHT_NAMES, Recipe, count_turns


class TurnSentimentClient(ClientHandler):
    def __init__(self, task: dict, data_root: str, partition_id: int, num_partitions: int):
        super().__init__(task, data_root, partition_id, num_partitions)
        self.recipe = Recipe.of(task, data_root)

    @staticmethod
    def population_size(task: dict, data_root: str) -> int:
        """Natural number of clients: one per training turn."""
        recipe = Recipe.of(task, data_root)
        return count_turns(recipe.data_root, recipe.train_splits)

    def discover(self) -> dict:
        return {keys.NUM_EXAMPLES: self.recipe.examples(self.partition_id, self.num_partitions)}

    def train(self, msg: Message) -> RecordDict:
        self.threads(msg.content[keys.CONFIG])
        weights, examples, loss = hosted_work.result(
            self.partition_id, msg, self.epoch, self.epochs
        )
        return self.weights_reply(
            dict(zip(WEIGHT_NAMES, weights)),
            {keys.NUM_EXAMPLES: examples, keys.TRAIN_LOSS: loss},
        )

    @classmethod
    def train_rows(cls, task, data_root, partitions, num_partitions, msg):
        """Every client's ``train`` reply as rows: the batched backend's epochs
        (:meth:`epochs`), ``hosted_work.CHUNK`` clients a computation as there, so each row is
        the bits ``train`` replies (a client's epoch is the same whoever shares it)."""
        cls.threads(msg.content[keys.CONFIG])
        recipe = Recipe.of(task, data_root)
        weights, seed, server_round, mu = cls._inputs(msg)
        n, stacked = len(partitions), []
        examples, losses = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.float64)
        for i in range(0, n, CHUNK):  # each chunk's rows in place: one copy of the n models
            chunk = slice(i, i + CHUNK)
            new, examples[chunk], losses[chunk] = recipe.local_updates(
                weights, partitions[chunk], num_partitions, seed, server_round, mu
            )
            stacked = stacked or [np.empty((n, *w.shape[1:]), dtype=w.dtype) for w in new]
            for out, rows in zip(stacked, new):
                out[chunk] = rows
        return [
            (keys.ARRAYS, ARRAY, dict(zip(WEIGHT_NAMES, stacked))),
            (keys.METRICS, METRIC, {keys.NUM_EXAMPLES: examples, keys.TRAIN_LOSS: losses}),
        ]

    @classmethod
    def _inputs(cls, msg: Message) -> tuple[list, int, int, float]:
        """The weights ``msg`` sends, its seed, round and FedProx ``mu``."""
        config, sent = msg.content[keys.CONFIG], cls.weights(msg)
        return (
            [sent[name] for name in WEIGHT_NAMES],
            int(config[keys.SEED]),
            cls.server_round(config),
            proximal_mu(config),
        )

    def epoch(self, msg: Message) -> tuple[list, int, float]:
        """This client's epoch (:meth:`Recipe.local_update`): the ``messages`` backend's."""
        weights, seed, server_round, mu = self._inputs(msg)
        new, examples, stats = self.recipe.local_update(
            weights, self.partition_id, self.num_partitions, seed, server_round, mu
        )
        return new, examples, stats["loss"]

    def epochs(self, msg: Message, partitions: list[int]) -> list[tuple[list, int, float]]:
        """The epochs ``msg`` asks of each of ``partitions`` (this client and its peers under the
        batched backend, ``fedsim/runtime/hosted_work.py``) as one batched computation."""
        weights, seed, server_round, mu = self._inputs(msg)
        stacked, examples, losses = self.recipe.local_updates(
            weights, partitions, self.num_partitions, seed, server_round, mu
        )
        rows = [[w[c] for w in stacked] for c in range(len(partitions))]
        return list(zip(rows, examples, losses))
