"""ClientApp side of FedE4RAG: a company (or any document group) training the retriever.

train: start from the weights the message names (its arrays, which under HE the HE layer fills
with this node's complete aggregate: ``fedsim/runtime/he_layer.py``, or the common initial model), run
the local objective on inverse-cloze pairs from the node's own pages, reply with the weights. With
``LOCAL_MODEL`` the company keeps its own retriever across rounds (``fedsim/runtime/client_state.py``,
on its own disk): the received weights become KD-GLE's frozen teacher (and FedProx's anchor) and the student continues
from the company's own weights (the received ones before its first round); what it trained is
kept and sent.
query: node info and the initial weights. evaluate: encode the corpus
one bounded piece per message under the named weights (``FROM_LOCAL``: the node's own
retriever, which never leaves it), then score FinanceBench retrieval.

A missing input is an error naming the method and the node, never a silent default: a node
asked for weights it does not hold must not report another model's metrics.
"""

from __future__ import annotations

import json
import time
from functools import cached_property, lru_cache

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from fedsim.code_policy import instantiate_allowed
from fedsim.config import node_local
from fedsim.runtime import client_state
from fedsim.runtime.records import from_record, to_record
from fedsim.seeding import stream
from fedsim_clients import fede4rag_messages as keys
from fedsim_clients.handler import ClientHandler
from fedsim_tasks.financebench_rag.dataset import (
    client_documents,
    load_documents,
    load_pages,
    question_texts,
    title,
)
from fedsim_tasks.financebench_rag.inference import cached_encoder
from fedsim_tasks.financebench_rag.pseudo_queries import (
    LLMQueryGenerator,
    header_pairs,
    inverse_cloze_pairs,
    line_item_pairs,
    single_page_segments,
)
from fedsim_tasks.financebench_rag.retrieval import (
    corpus_store,
    evaluation_data,
    score_splits,
    weights_key,
)
from fedsim_tasks.financebench_rag.train import frozen_copy, train_encoder
from fedsim_tasks.hf import build_encoder, load_trainable, trainable_arrays
from fedsim_tasks.proximal import ProximalTerm, proximal_mu

TRAINING = stream(
    "retriever-training", "round", "partition", bits=32
)  # shuffle and dropout of a round's steps
PSEUDO_QUERIES = stream(
    "pseudo-queries", "document"
)  # a filing's inverse-cloze pairs, whichever client holds it


@lru_cache(maxsize=1)
def _encoder(name: str, max_seq_length: int, lora_json: str, seed: int):
    """One encoder per process with its initial trainable weights, shared by every client a
    SuperNode or Ray actor hosts (the OpenFedLLM pattern): each message loads its client's
    weights into it, as ``_load_weights`` does on every path. The initial weights are the same
    for every client: the adapters' init is seeded by the task's seed. One encoder per client
    held a model per cached handler (64) and built one for each other client served."""
    model = build_encoder(name, max_seq_length, json.loads(lora_json), seed)
    return model, trainable_arrays(model)


class MissingWeights(RuntimeError):
    """The message names weights this node was not given or does not hold."""


class RetrieverClient(ClientHandler):
    def __init__(self, task: dict, data_root: str, partition_id: int, num_partitions: int):
        super().__init__(task, data_root, partition_id, num_partitions)
        self.documents = self._documents(partition_id)
        self.model, self.initial = _encoder(
            task["model"],
            task["max_seq_length"],
            json.dumps(task["lora"], sort_keys=True),
            task["seed"],
        )

    def _documents(self, partition_id: int) -> list[str]:
        return client_documents(
            self.data_root,
            self.task["companies"],
            instantiate_allowed(self.task["partitioner"], "task.partitioner"),
            partition_id,
        )

    def _pairs(self, documents: list[str]) -> list[tuple[str, str]]:
        """Pseudo-query pairs from the documents' pages (the first ``pages_per_client``), each
        positive led by its filing's title where the corpus entries are (``passages.titles``),
        each query where ``pseudo_queries.titles`` asks (questions name company and year)."""
        pq = self.task["pseudo_queries"]
        pages = [(doc, p) for doc in documents for p in load_pages(self.data_root, doc)]
        pages = pages[: self.task["pages_per_client"]] if self.task["pages_per_client"] else pages
        titled = bool((self.task.get("passages") or {}).get("titles"))
        generator, pairs = LLMQueryGenerator(pq["generator"]) if pq["generator"] else None, []
        construction = pq["construction"]
        allowed = (
            single_page_segments([p for _, p in pages])
            if construction == "unique_inverse_cloze"
            else None
        )
        for doc in dict.fromkeys(doc for doc, _ in pages):
            texts, seed = (
                [p for d, p in pages if d == doc],
                PSEUDO_QUERIES.seed(self.task["seed"], document=doc),
            )
            if generator:
                found = generator.pairs(texts, pq["chunk_size"], pq["chunk_overlap"])
            elif construction == "headers":
                found = header_pairs(texts, pq["chunk_size"], pq["min_query_words"], seed)
            elif construction == "line_item_questions":
                found = line_item_pairs(
                    texts, *self._company_year(doc), question_texts(self.data_root)
                )
            else:
                found = inverse_cloze_pairs(
                    texts,
                    pq["chunk_size"],
                    pq["chunk_overlap"],
                    pq["min_query_words"],
                    pq["max_query_words"],
                    seed,
                    allowed,
                )
            name = title(self.data_root, doc)
            pairs += [
                (
                    (f"{name}: " if pq.get("titles") else "") + q,
                    (f"{name}\n" if titled else "") + positive,
                )
                for q, positive in found
            ]
        return pairs

    def _company_year(self, doc: str) -> tuple[str, int]:
        row = next(d for d in load_documents(self.data_root) if d["doc_name"] == doc)
        return row["company"], row["doc_period"]

    @cached_property
    def pairs(self) -> list[tuple[str, str]]:
        return self._pairs(self.documents)

    @cached_property
    def evaluation(self) -> tuple[dict, dict[str, str]]:
        """Questions and test corpus, built once per process."""
        return evaluation_data(self.data_root, self.task)

    def initial_weights(self, msg: Message) -> dict[str, np.ndarray]:
        return self.initial

    def _load_weights(self, msg: Message) -> str:
        """Load the weights the message names into the model; return their key."""
        config = msg.content[keys.CONFIG]
        where = f"{config.get(keys.METHOD, '<no method>')}: node {self.partition_id}"
        source = config.get(keys.WEIGHTS)
        if source == keys.FROM_INITIAL:
            weights = None
        elif source in (keys.FROM_ARRAYS, keys.FROM_HE):  # FROM_HE: the HE layer put them there
            arrays = msg.content.array_records.get(keys.ARRAYS)
            if arrays is None or not len(arrays):
                raise MissingWeights(
                    f"{where} was asked for weights={source} but the message carries no arrays"
                )
            weights = from_record(arrays)
        elif source == keys.FROM_LOCAL:
            weights = client_state.of(msg, self.partition_id).load(
                str(config[keys.LOCAL_MODEL]), 2**62
            )
            if weights is None:
                raise MissingWeights(
                    f"{where} was asked for its local retriever "
                    f"{config[keys.LOCAL_MODEL]!r} but has not trained one"
                )
        else:
            raise MissingWeights(f"{where}: weights={source!r} is not one of {keys.WEIGHT_SOURCES}")
        load_trainable(self.model, self.initial if weights is None else weights)
        return weights_key(self.task["model"], self.task["lora"], weights)

    def _own_model(self, msg: Message):
        """FedProx's term anchored at the weights just loaded (the received global); with
        ``LOCAL_MODEL`` also those frozen as KD's teacher, the student moved to the company's
        own retriever, and its state to keep the trained one in (else None, None)."""
        config = msg.content[keys.CONFIG]
        proximal = ProximalTerm(self.model, proximal_mu(config))
        if keys.LOCAL_MODEL not in config:
            return proximal, None, None
        state = client_state.of(msg, self.partition_id)
        teacher = frozen_copy(self.model) if float(config[keys.KD_WEIGHT]) else None
        own = state.load(str(config[keys.LOCAL_MODEL]), self.server_round(config))
        if own is not None:
            load_trainable(self.model, own)
        return proximal, teacher, state

    def query(self, msg: Message) -> RecordDict:
        if msg.content[keys.CONFIG].get(keys.QUERY_OP) == keys.INITIAL_WEIGHTS:
            return RecordDict({keys.ARRAYS: to_record(self.initial)})
        return super().query(msg)

    def discover(self) -> dict:
        return {
            keys.DOCUMENTS: self.documents,
            keys.COMPANIES: sorted(
                {
                    d["company"]
                    for d in load_documents(self.data_root)
                    if d["doc_name"] in set(self.documents)
                }
            ),
            keys.NUM_PAIRS: len(self.pairs),
        }

    def train(self, msg: Message) -> RecordDict:
        """Train from the message's weights; the reply's metrics time each part of the handler
        (``bench/local_training.py`` compares them with a plain loop)."""
        begin = time.perf_counter()
        config = msg.content[keys.CONFIG]
        self.threads(config)
        self._load_weights(msg)
        proximal, teacher, state = self._own_model(msg)
        loaded = time.perf_counter()
        pool = list(config.get(keys.POOL_PARTITIONS, []))
        pairs = (
            self.pairs
            if not pool
            else self._pairs(sorted({d for p in pool for d in self._documents(int(p))}))
        )
        start = time.perf_counter()
        stats = train_encoder(
            self.model,
            pairs,
            int(config[keys.LOCAL_STEPS]),
            int(config[keys.BATCH_SIZE]),
            float(config[keys.LR]),
            float(config[keys.TEMPERATURE]),
            float(config[keys.KD_WEIGHT]),
            seed=self.seed(TRAINING, config),
            teacher=teacher,
            dropout=bool(self.task.get("train_dropout", False)),
            proximal=proximal,
        )
        end = time.perf_counter()
        metrics = {
            keys.NUM_EXAMPLES: len(pairs),
            "train-seconds": end - start,
            "weights-seconds": loaded - begin,
            "pairs-seconds": start - loaded,
            keys.TORCH_THREADS: torch.get_num_threads(),
            **{k: float(v) for k, v in stats.items()},
        }
        trained = trainable_arrays(self.model)
        if state is not None:
            state.save(str(config[keys.LOCAL_MODEL]), self.server_round(config), trained)
            metrics[keys.STATE_BYTES] = state.bytes()
        reply = self.weights_reply(trained, metrics)
        reply[keys.METRICS]["reply-seconds"] = time.perf_counter() - end
        reply[keys.METRICS]["handler-seconds"] = time.perf_counter() - begin
        return reply

    def evaluate(self, msg: Message) -> RecordDict:
        config = msg.content[keys.CONFIG]
        threads = self.threads(config)
        key = self._load_weights(msg)
        questions, corpus = self.evaluation
        # without a cache, the run's folder (not this client's): the evaluating nodes of one
        # machine fill one store (protocol.eval_nodes)
        folder = (
            node_local.setting(msg, "embedding-cache")
            or client_state.run_folder(msg) / "embeddings"
        )
        backend = str(config[keys.EVAL_BACKEND])
        store = corpus_store(
            self.model, key, corpus, folder, int(config[keys.PAGES_PER_MESSAGE]), backend
        )
        start = time.perf_counter()
        if config[keys.EVAL_OP] == keys.ENCODE:
            graphs = client_state.of(msg, self.partition_id).folder / "encoder"

            def encode(
                texts: list[str],
            ):  # built when a piece is missing: once per weights in this process
                return cached_encoder(self.model, key, backend, threads, graphs)(texts)

            metrics = {
                keys.MISSING: store.encode_piece(
                    int(config[keys.PIECE]), encode, list(corpus.values())
                ),
                keys.PIECES: store.pieces,
                keys.CORPUS_PAGES: len(corpus),
            }
        else:
            groups = (
                {str(p): self._documents(p) for p in range(self.num_partitions)}
                if config.get(keys.PER_CLIENT, False)
                else None
            )
            metrics = score_splits(
                self.model,
                self.data_root,
                questions,
                list(corpus),
                store.load(),
                self.task,
                list(config[keys.SPLITS]),
                bool(config.get(keys.PER_FILING, False)),
                groups,
            )
        metrics["eval-seconds"] = time.perf_counter() - start
        return RecordDict(
            {
                keys.METRICS: MetricRecord(metrics),
                keys.WEIGHTS_INFO: ConfigRecord({keys.WEIGHTS_KEY: key}),
            }
        )

    @staticmethod
    def population_size(task: dict, data_root: str) -> int:
        from fedsim_tasks.financebench_rag.dataset import document_table

        partitioner = instantiate_allowed(task["partitioner"], "task.partitioner")
        partitioner.dataset = document_table(data_root, task["companies"])
        return partitioner.num_partitions
