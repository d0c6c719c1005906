"""ClientApp side of FedE4RAG: a company (or any document group) training the retriever.

train: start from the global weights (sent in plaintext, or this node's decrypted copy under
HE), run the local objective on inverse-cloze pairs from the node's own pages, reply with the
weights (plaintext) or keep them for the encrypted chunks (HE). query: node info and the HE
chunk operations. evaluate: FinanceBench retrieval metrics of the weights given.
"""

from __future__ import annotations

import os
import time
from functools import cached_property

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from hydra.utils import instantiate

from fedsim.he import CKKSParams
from fedsim.he_client import HEClient, state_dir
from tasks.financebench_rag.dataset import client_documents, load_documents, load_pages
from tasks.financebench_rag.model import (build_encoder, flatten, load_trainable,
                                          trainable_arrays, unflatten)
from tasks.financebench_rag.pseudo_queries import LLMQueryGenerator, inverse_cloze_pairs
from tasks.financebench_rag.retrieval import evaluate_splits, fingerprint
from tasks.financebench_rag.train import train_encoder


class RetrieverClient:
    def __init__(self, task: dict, data_root: str, partition_id: int, num_partitions: int):
        self.task, self.root, self.pid = task, data_root, partition_id
        self.documents = self._documents(partition_id)
        self.model = build_encoder(task["model"], task["max_seq_length"], task["lora"],
                                   task["seed"])
        self.initial = trainable_arrays(self.model)
        self._he_clients: dict[int, HEClient] = {}

    def _documents(self, partition_id: int) -> list[str]:
        return client_documents(self.root, self.task["companies"],
                                instantiate(self.task["partitioner"]), partition_id)

    def _pairs(self, documents: list[str]) -> list[tuple[str, str]]:
        pq = self.task["pseudo_queries"]
        pages = [p for doc in documents for p in load_pages(self.root, doc)]
        pages = pages[:self.task["pages_per_client"]] if self.task["pages_per_client"] else pages
        if pq["generator"]:
            return LLMQueryGenerator(pq["generator"]).pairs(pages, pq["chunk_size"],
                                                            pq["chunk_overlap"])
        return inverse_cloze_pairs(pages, pq["chunk_size"], pq["chunk_overlap"],
                                   pq["min_query_words"], pq["max_query_words"],
                                   self.task["seed"])

    @cached_property
    def pairs(self) -> list[tuple[str, str]]:
        return self._pairs(self.documents)

    def _he(self, msg: Message) -> HEClient:
        """This node's HE state for the message's run, kept so the secret context is read
        from ``key_dir`` once, not on every chunk."""
        run_id = msg.metadata.run_id
        if run_id not in self._he_clients:
            h = self.task["he"]
            params = CKKSParams(h["poly_modulus_degree"], tuple(h["coeff_mod_bit_sizes"]),
                                h["global_scale_bits"])
            self._he_clients[run_id] = HEClient(
                params, h["key_dir"], state_dir(self.task["state_dir"], run_id, self.pid))
        return self._he_clients[run_id]

    def _set_weights(self, msg: Message, source: str) -> str:
        """Load the weights to start from; returns a key naming them (for the cache)."""
        arrays = msg.content.array_records.get("arrays")
        if source == "arrays" and arrays is not None and len(arrays):
            weights = {k: v.numpy() for k, v in arrays.items()}
        elif source == "he-global" and (flat := self._he(msg).global_weights()) is not None:
            weights = unflatten(flat, self.initial)
        elif source in ("arrays", "he-global", "initial"):
            weights = self.initial
        else:
            raise ValueError(f"unknown weight source {source!r}")
        load_trainable(self.model, weights)
        if weights is self.initial:
            return fingerprint(self.task["model"], self.task["lora"], "initial")
        return fingerprint(self.task["model"], self.task["lora"],
                           *(np.ascontiguousarray(w).tobytes() for w in weights.values()))

    @staticmethod
    def _threads(config: ConfigRecord) -> None:
        threads = int(config.get("torch-threads", 0)) or os.cpu_count() or 1
        torch.set_num_threads(threads)

    def query(self, msg: Message, context=None) -> RecordDict:
        config = msg.content["config"]
        op = config.get("he-op", "")
        if op == "encrypt":
            return self._he(msg).encrypt(msg)
        if op == "install":
            return self._he(msg).install(msg)
        return RecordDict({"info": ConfigRecord({
            "partition-id": self.pid, "documents": self.documents,
            "companies": sorted({d["company"] for d in load_documents(self.root)
                                 if d["doc_name"] in set(self.documents)}),
            "num-pairs": len(self.pairs)})})

    def train(self, msg: Message, context=None) -> RecordDict:
        config = msg.content["config"]
        self._threads(config)
        he_round = bool(config.get("he", False))
        self._set_weights(msg, "he-global" if he_round else "arrays")
        pool = list(config.get("pool-partitions", []))
        pairs = self.pairs if not pool else \
            self._pairs(sorted({d for p in pool for d in self._documents(int(p))}))
        start = time.perf_counter()
        stats = train_encoder(
            self.model, pairs, int(config["local-steps"]), int(config["batch-size"]),
            float(config["lr"]), float(config["temperature"]), float(config["kd-weight"]),
            seed=int(config.get("seed", 0)) * 1000 + int(config.get("server-round", 0)) * 10
            + self.pid)
        metrics = {"num-examples": len(pairs), "train-seconds": time.perf_counter() - start,
                   **{k: float(v) for k, v in stats.items()}}
        trained = trainable_arrays(self.model)
        if he_round:
            return self._he(msg).train_reply(flatten(trained), metrics)
        return RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in trained.items()}),
                           "metrics": MetricRecord(metrics)})

    def evaluate(self, msg: Message, context=None) -> RecordDict:
        config = msg.content["config"]
        self._threads(config)
        key = self._set_weights(msg, str(config.get("weights", "arrays")))
        start = time.perf_counter()
        metrics = evaluate_splits(self.model, key, self.root, self.task, list(config["splits"]))
        metrics["eval-seconds"] = time.perf_counter() - start
        metrics["num-examples"] = 1
        return RecordDict({"metrics": MetricRecord(metrics)})

    @staticmethod
    def population_size(task: dict, data_root: str) -> int:
        from tasks.financebench_rag.dataset import document_table
        partitioner = instantiate(task["partitioner"])
        partitioner.dataset = document_table(data_root, task["companies"])
        return partitioner.num_partitions
