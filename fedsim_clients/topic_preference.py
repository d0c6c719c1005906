"""ClientApp side of FedTP: one Topical-Chat conversation per SuperNode.

train: send p_c, the local topic preference, for the conversations in the requested splits.
evaluate: route the node's own second-half grounded turns under every router variant the
server asks for, with the released priors it sent, and return metric sums per split plus the
turn-level outcomes the paired analyses need.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from datasets import Dataset
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedsim.runtime.partitioners import RoundRobinResamplingPartitioner
from fedsim.runtime.row_batches import ARRAY, METRIC
from fedsim_clients import fedtp_messages as keys
from fedsim_clients.handler import ClientHandler
from fedsim_tasks.topical_chat.dataset import load_conversations, load_topics, local_preference
from fedsim_tasks.topical_chat.router import RouterVariant, router_for

METRICS = ("err", "support")


@lru_cache(maxsize=4)
def _partitioner(population: int, num_partitions: int) -> RoundRobinResamplingPartitioner:
    """One per population and client count: a SuperNode hosting thousands of logical clients
    (``hardware.clients_per_supernode``) builds the row table once, not once per client."""
    partitioner = RoundRobinResamplingPartitioner(num_partitions)
    partitioner.dataset = Dataset.from_dict({"row": list(range(population))})
    return partitioner


def hosted_rows(population: int, num_partitions: int, partition_id: int) -> list[int]:
    """The population rows partition ``partition_id`` hosts: public and deterministic, so the
    server checks what a node says it hosts against it."""
    return _partitioner(population, num_partitions).partition_indices(partition_id)


def hosted_conversations(task: dict, data_root: str, num_partitions: int, partition_id: int):
    """The population rows partition ``partition_id`` hosts and their conversations."""
    population = load_conversations(
        data_root, tuple(task["splits"]), task.get("max_per_split"), task.get("split_seed")
    )
    rows = hosted_rows(len(population), num_partitions, partition_id)
    return rows, [population[i] for i in rows]


def in_splits(rows: list[int], conversations: list, config: ConfigRecord) -> list[tuple]:
    """The (row, conversation) pairs of the splits the message's config asks for."""
    splits = set(config[keys.SPLITS])
    return [(row, c) for row, c in zip(rows, conversations) if c.split in splits]


class TopicPreferenceClient(ClientHandler):
    def __init__(self, task: dict, data_root: str, partition_id: int, num_partitions: int):
        super().__init__(task, data_root, partition_id, num_partitions)
        self.rows, self.conversations = hosted_conversations(
            task, data_root, num_partitions, partition_id
        )
        self.num_topics = len(load_topics(data_root))

    def _selected(self, config: ConfigRecord):
        return in_splits(self.rows, self.conversations, config)

    def discover(self) -> dict:
        return {keys.INFO_SPLITS: [c.split for c in self.conversations], keys.INFO_ROWS: self.rows}

    def train(self, msg: Message) -> RecordDict:
        selected = self._selected(msg.content[keys.CONFIG])
        vectors = np.stack([local_preference(c, self.num_topics) for _, c in selected])
        return RecordDict(
            {
                keys.ARRAYS: ArrayRecord({keys.VECTORS: Array(vectors)}),
                keys.METRICS: MetricRecord({keys.NUM_EXAMPLES: len(selected)}),
            }
        )

    @classmethod
    def train_rows(cls, task, data_root, partitions, num_partitions, msg):
        """Every client's ``train`` reply as rows: its p_c over the same conversations, where
        each client holds as many of the requested splits as the others (else None: replies
        of other shapes, served one by one)."""
        config = msg.content[keys.CONFIG]
        selected = [
            in_splits(*hosted_conversations(task, data_root, num_partitions, p), config)
            for p in partitions
        ]
        if not selected[0] or len({len(s) for s in selected}) != 1:
            return None
        num_topics = len(load_topics(data_root))
        vectors = np.array([[local_preference(c, num_topics) for _, c in s] for s in selected])
        examples = np.full(len(selected), len(selected[0]), dtype=np.int64)
        return [
            (keys.ARRAYS, ARRAY, {keys.VECTORS: vectors}),
            (keys.METRICS, METRIC, {keys.NUM_EXAMPLES: examples}),
        ]

    def evaluate(self, msg: Message) -> RecordDict:
        config = msg.content[keys.CONFIG]
        priors = (
            {k: v.numpy() for k, v in msg.content[keys.PRIORS].items()}
            if keys.PRIORS in msg.content.array_records
            else {}
        )
        variants = [
            RouterVariant(*v)
            for v in zip(
                config[keys.VARIANT_NAMES],
                config[keys.VARIANT_PRIORS],
                config[keys.VARIANT_ALPHAS],
                config[keys.VARIANT_LAMBDAS],
            )
        ]
        router = router_for(self.data_root)
        metrics: dict = {keys.NUM_EXAMPLES: 0}
        turns: dict[str, list] = {}
        for row, conv in self._selected(config):
            out = router.route(conv, local_preference(conv, self.num_topics), priors, variants)
            n = len(out["gold"])
            metrics[keys.NUM_EXAMPLES] += n
            metrics[f"{conv.split}/turns"] = metrics.get(f"{conv.split}/turns", 0) + n
            for v in variants:
                prefix = f"{conv.split}/{v.name}"
                hits = int(np.sum(out[f"pick/{v.name}"] == out["gold"]))
                metrics[f"{prefix}/hits"] = metrics.get(f"{prefix}/hits", 0) + hits
                for m in METRICS:
                    metrics[f"{prefix}/{m}"] = metrics.get(f"{prefix}/{m}", 0.0) + float(
                        out[f"{m}/{v.name}"].sum()
                    )
            if config.get(keys.TURN_LEVEL, False):
                out["row"] = np.full(n, row)
                for key, values in out.items():
                    turns.setdefault(key, []).extend(values.tolist())
        for key, values in turns.items():
            cast = float if key.startswith(METRICS) else int
            metrics[f"{keys.TURN_PREFIX}{key}"] = [cast(x) for x in values]
        return RecordDict({keys.METRICS: MetricRecord(metrics)})

    @staticmethod
    def population_size(task: dict, data_root: str) -> int:
        """Natural number of clients: one per conversation of the federation's splits."""
        return len(load_conversations(data_root, tuple(task["splits"]), task.get("max_per_split")))
