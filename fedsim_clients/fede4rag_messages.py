"""FedE4RAG's message format: the record and config keys that the protocol
(``fedsim_experiments/fede4rag/protocol.py``) and the client (``fedsim_clients/retriever.py``) exchange. HE chunk
operations use ``fedsim.privacy.he.messages``; what each phase's reply must be."""

import math
from collections.abc import Callable

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedsim.message_keys import *  # noqa: F403 (the shared keys, re-exported: both ends read every key here)
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.privacy.he import messages as he_keys
from fedsim.runtime.validators import (
    Arrays,
    Bound,
    Config,
    Metrics,
    Number,
    Numbers,
    Reply,
    Text,
    Texts,
    Validator,
    discovery_reply,
    weight,
)

# the shared keys as FedE4RAG uses them: ARRAYS trainable weights (plaintext); NUM_EXAMPLES (train)
# the pairs, FedAvg's weight; LR AdamW's; LOCAL_MODEL the name under which the node keeps its own
# retriever across rounds (train: the student continues from it, the received weights are KD's
# frozen teacher; absent: train from the received weights)

DOCUMENTS = "documents"  # INFO: the node's documents
COMPANIES = "companies"  # ... their companies
NUM_PAIRS = "num-pairs"  # ... its training pairs
QUERY_OP = "query-op"  # config (query): INITIAL_WEIGHTS, else discovery
INITIAL_WEIGHTS = "initial-weights"  # QUERY_OP value: reply with the common initial weights

METHOD = "method"  # config: the method the message serves (named in errors)
WEIGHTS = "weights"  # config: the weights to train / evaluate, one of:
FROM_ARRAYS = ARRAYS  #   the message's ARRAYS (must be present and non-empty)
FROM_HE = "he-global"  #   the node's complete HE aggregate of he-global-round
FROM_INITIAL = "initial"  #   the common initial model (seeded adapters)
FROM_LOCAL = "local"  #   the node's own local retriever kept under LOCAL_MODEL (evaluate)
WEIGHT_SOURCES = (FROM_ARRAYS, FROM_HE, FROM_INITIAL, FROM_LOCAL)

TEMPERATURE = "temperature"  # config (train): InfoNCE temperature
KD_WEIGHT = "kd-weight"  # config (train): weight of KD-GLE
POOL_PARTITIONS = "pool-partitions"  # config (train): pool these partitions' pairs (centralized)

EVAL_OP = "eval-op"  # config (evaluate): ENCODE or SCORE
ENCODE = "encode"  # encode one piece of the corpus (PIECE) under the weights
SCORE = "score"  # retrieve and score with the fully encoded corpus
PAGES_PER_MESSAGE = "pages-per-message"  # config (evaluate): pages of one ENCODE piece
PIECE = "piece"  # config (encode): index of the piece to encode (skipped if present)
EVAL_BACKEND = "eval-backend"  # config (evaluate): corpus encoder, a key of inference.BACKENDS
SPLITS = "splits"  # config (evaluate): question splits to score
PER_FILING = "per-filing"  # config (evaluate): also score within each question's filing
PER_CLIENT = (
    "per-client"  # config (evaluate): also score each client's questions within its filings
)
MISSING = "missing-pieces"  # METRICS (encode): indices of the pieces still missing after this one
PIECES = "pieces"  # METRICS (encode): pieces of the corpus in all
CORPUS_PAGES = "corpus-pages"  # METRICS (encode): pages of the corpus
WEIGHTS_INFO = "weights-info"  # ConfigRecord of evaluate replies ...
WEIGHTS_KEY = "key"  # ... fingerprint of the weights evaluated


# --- what each phase's reply must be (checked in the Messenger's screen: fedsim/runtime/validators.py) --


def discover_reply(
    partition_of: Callable[[int], int | None],
    documents: Callable[[int], list[str]] | None,
    partitions: int,
) -> Reply:
    """Who a node is: its partition (the one it told at ``whoami``, where known), the documents
    the public partitioning gives that partition (``documents``, where the server computes them),
    their companies and its training pairs (a claim the server cannot check: its FedAvg weight)."""

    def check(info: ConfigRecord, partition: int) -> str | None:
        return (
            None
            if documents is None or list(info[DOCUMENTS]) == documents(partition)
            else "not the documents its partition holds"
        )

    return discovery_reply(
        partition_of,
        partitions,
        {DOCUMENTS: Texts(), COMPANIES: Texts(), NUM_PAIRS: weight(math.inf, low=0)},
        check,
    )


def weights_reply(like: ArrayRecord | None = None) -> Reply:
    """A retriever's weights (the initial ones; a single node's trained ones): finite arrays, shaped
    as ``like`` where the server holds the model."""
    return Reply({ARRAYS: Arrays(like)})


def train_reply(sent: ArrayRecord | None, pairs: Bound, loss_key: str | None) -> Reply:
    """A trained retriever: the arrays of the model ``sent``, its pairs (FedAvg's weight, at most
    ``pairs``: what the node declared) and the loss a loss-weighted strategy reads."""
    required = {NUM_EXAMPLES: weight(pairs)} | ({loss_key: Number()} if loss_key else {})
    return Reply({ARRAYS: Arrays(sent), METRICS: Metrics(required)})


def he_train_weight(pairs: Bound) -> Validator:
    """An HE train reply's pairs (its weight) within what its node declared (``HEFedAvg`` checks
    the rest of the reply)."""
    declared = weight(pairs)
    return lambda content, node: declared.problem(content[he_keys.METRICS][NUM_EXAMPLES], node)


def encode_reply(pages_per_piece: int) -> Reply:
    """A corpus piece encoded: the pieces still missing (indices below the pieces in all), the
    pages of the corpus and its pieces of ``pages_per_piece``, the key of the weights used."""

    def check(content: RecordDict, node: int) -> str | None:
        metrics = content[METRICS]
        if metrics[PIECES] != max(1, math.ceil(metrics[CORPUS_PAGES] / pages_per_piece)):
            return (
                f"{metrics[PIECES]} pieces of {pages_per_piece} for {metrics[CORPUS_PAGES]} pages"
            )
        return (
            None
            if all(i < metrics[PIECES] for i in metrics[MISSING])
            else "missing pieces beyond the corpus"
        )

    count = Number(0, whole=True)
    return Reply(
        {
            METRICS: Metrics(
                {MISSING: Numbers(count), PIECES: Number(1, whole=True), CORPUS_PAGES: count}
            ),
            WEIGHTS_INFO: Config({WEIGHTS_KEY: Text()}),
        },
        check=check,
    )


def score_reply(
    labels: list[str], metrics: tuple[str, ...], key: str | None, optional_labels: list[str] = ()
) -> Reply:
    """Retrieval scores of every label (split, per filing) in [0, 1], its questions and corpus
    pages, and the key of the weights scored: ``key`` where the server holds the model (a node
    must score the weights the method produced). ``optional_labels`` (a client's questions,
    where it owns some) may be scored, bounded alike."""
    count = Number(0, whole=True)

    def scores(names):
        return {f"{label}/{m}": Number(0.0, 1.0) for label in names for m in metrics} | {
            f"{label}/{n}": count for label in names for n in ("questions", "corpus-pages")
        }

    required = scores(labels)
    optional = {f"{label}/corpus-entries": count for label in labels} | scores(optional_labels)
    scored = Text(choices=None if key is None else (key,))
    return Reply(
        {METRICS: Metrics(required, optional), WEIGHTS_INFO: Config({WEIGHTS_KEY: scored})}
    )
