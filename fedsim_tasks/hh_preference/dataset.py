"""HH-RLHF preference pairs for FedBis / FedBiscuit (METHODS.md section 4).

Each upstream row holds two full dialogues that differ in the last Assistant turn. A pair is the
shared prefix x (ending with ``Assistant:``) and the two last turns, y_w (HH's harmless choice)
and y_l. Selectors see every pair in both orders, (x, y_w, y_l, 0) and (x, y_l, y_w, 1), so
position carries no signal.

Splits are one seeded permutation of the pairs, never overlapping: the held-out ``test`` pairs,
the ``judge`` pairs (the evaluation reward model's only data), the ``server`` prompts (RLHF
phase) and the client pool. The pool is partitioned over clients by flwr-datasets'
``DirichletPartitioner`` over prompt topics (KMeans clusters of the MiniLM embeddings of each
prompt's first Human turn, the stand-in for the paper's SHP domains); each client keeps a share
of its own pairs for validation. A seeded ``minority`` share of the clients prefers the other
response on some pairs (:func:`minority_flips`): on all of them (HH's label reversed), or on
those where HH's label is weak and a second criterion picks the other response: a population a
method can discover.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Container
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedsim.code_policy import instantiate_allowed
from fedsim.config.data import require_file
from fedsim.seeding import stream

UPSTREAM = "github.com/anthropics/hh-rlhf, harmless-base test (MIT)"
FILE = Path("hh_rlhf") / "harmless-base-test.jsonl.gz"
ASSISTANT = "\n\nAssistant:"
HUMAN = "\n\nHuman:"
SPLITS = ("test", "judge", "server", "pool")
# the split seed's streams
SPLIT = stream("preference-splits")
TOPICS = stream("preference-topics", bits=32)  # scikit-learn's random_state takes 32 bits
MINORITY = stream("minority-clients")
PROBE_FOLDS = stream("hh-probe-folds")
HOLDOUT = stream("preference-holdout", "partition")


@dataclass(frozen=True)
class Pair:
    """One preference pair: the shared prompt and HH's preferred / rejected last turns."""

    pair_id: int
    prompt: str  # the dialogue prefix, ending with "\n\nAssistant:"
    chosen: str  # y_w: HH's preferred last Assistant turn
    rejected: str  # y_l

    @property
    def last_human(self) -> str:
        """The Human turn the responses answer (what a small selector sees of the prompt)."""
        return self.prompt[self.prompt.rfind(HUMAN) + len(HUMAN) : -len(ASSISTANT)].strip()

    @property
    def first_human(self) -> str:
        start = self.prompt.find(HUMAN) + len(HUMAN)
        end = self.prompt.find(ASSISTANT, start)
        return self.prompt[start:end].strip()


@dataclass(frozen=True)
class Example:
    """A selector example: which of A and B the labeller prefers (0: A, 1: B)."""

    pair_id: int
    prompt: str
    a: str
    b: str
    label: int


def parse_pair(pair_id: int, chosen: str, rejected: str) -> Pair | None:
    """Split at the last ``Assistant:`` before the first differing character; None when the two
    dialogues do not differ in one last Assistant turn (4 of the 2,312 rows)."""
    first = next(
        (i for i, (c, r) in enumerate(zip(chosen, rejected)) if c != r),
        min(len(chosen), len(rejected)),
    )
    cut = chosen.rfind(ASSISTANT, 0, first)
    if cut < 0 or chosen[:cut] != rejected[:cut]:
        return None
    prompt_end = cut + len(ASSISTANT)
    y_w, y_l = chosen[prompt_end:].strip(), rejected[prompt_end:].strip()
    if not y_w or not y_l or y_w == y_l or HUMAN in y_w or HUMAN in y_l:
        return None
    return Pair(pair_id, chosen[:prompt_end], y_w, y_l)


@lru_cache(maxsize=4)
def load_pairs(data_root: str) -> tuple[Pair, ...]:
    path = require_file(Path(data_root) / FILE, UPSTREAM)
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    pairs = (parse_pair(i, row["chosen"], row["rejected"]) for i, row in enumerate(rows))
    return tuple(p for p in pairs if p is not None)


def both_orders(pairs, flipped: Container[int] = frozenset()) -> list[Example]:
    """Every pair as (x, y_w, y_l, 0) and (x, y_l, y_w, 1); a pair whose id is in ``flipped``
    is labelled the other way (its labeller prefers HH's rejected response)."""
    out = []
    for p in pairs:
        good, bad = (p.rejected, p.chosen) if p.pair_id in flipped else (p.chosen, p.rejected)
        out += [
            Example(p.pair_id, p.prompt, good, bad, 0),
            Example(p.pair_id, p.prompt, bad, good, 1),
        ]
    return out


def split_pairs(pairs, sizes: dict[str, int], seed: int) -> dict[str, list[Pair]]:
    """One seeded permutation cut into ``test``, ``judge`` and ``server`` of the given sizes;
    the rest is the client ``pool``."""
    need = sum(sizes[k] for k in SPLITS[:-1])
    if need >= len(pairs):
        raise ValueError(f"splits {sizes} leave no client pairs out of {len(pairs)}")
    order = np.random.default_rng(SPLIT.seed(seed)).permutation(len(pairs))
    out, start = {}, 0
    for name in SPLITS[:-1]:
        out[name] = [pairs[i] for i in order[start : start + sizes[name]]]
        start += sizes[name]
    out["pool"] = [pairs[i] for i in order[start:]]
    return out


def topics(pairs, model: str, n_topics: int, seed: int) -> np.ndarray:
    """KMeans topic of each pair's first Human turn (MiniLM sentence embeddings)."""
    from sentence_transformers import SentenceTransformer
    from sklearn.cluster import KMeans

    from fedsim_tasks.hf import resolve_model

    encoder = SentenceTransformer(resolve_model(model), device="cpu")
    emb = encoder.encode([p.first_human for p in pairs], batch_size=64, normalize_embeddings=True)
    return KMeans(n_topics, n_init=4, random_state=TOPICS.seed(seed)).fit_predict(emb)


def client_partition(
    pool: list[Pair], pool_topics: np.ndarray, partitioner, partition_id: int
) -> list[Pair]:
    """The pool pairs of one client under a flwr-datasets partitioner over a ``topic`` column
    (default: ``DirichletPartitioner(partition_by="topic", alpha=0.3)``)."""
    from datasets import Dataset

    partitioner.dataset = Dataset.from_dict(
        {"row": list(range(len(pool))), "topic": [int(t) for t in pool_topics]}
    )
    return [pool[i] for i in partitioner.load_partition(partition_id)["row"]]


def minority_flips(pairs, preference: dict, seed: int) -> frozenset[int]:
    """The ids of the pairs whose label the minority reverses (``task.minority_preference``).

    ``reversed``: every pair. ``second_criterion``: the minority keeps HH's label where an HH
    probe backs it and decides by response length (``prefer``: longer | shorter, in words; a
    tie keeps HH's label) on the ``weak_share`` of pairs the probe backs least. The probe is a
    :class:`~fedsim_tasks.hh_preference.selector.TfidfScorer` of the responses alone, cross-fitted
    over two seeded halves of ``pairs`` (each half scored by the model of the other), its margin
    signed toward HH's choice: a pair the probe finds against HH counts as weak too. It reads
    other features than the MiniLM selectors, so "weak" is not what a selector already sees."""
    if preference["kind"] == "reversed":
        return frozenset(p.pair_id for p in pairs)
    backing = hh_backing(tuple(pairs), seed)
    weak = np.argsort(backing, kind="stable")[: int(round(preference["weak_share"] * len(pairs)))]
    sign = 1 if preference["prefer"] == "longer" else -1
    return frozenset(
        pairs[i].pair_id
        for i in weak
        if sign * (len(pairs[i].rejected.split()) - len(pairs[i].chosen.split())) > 0
    )


@lru_cache(maxsize=4)
def hh_backing(pairs: tuple[Pair, ...], seed: int) -> np.ndarray:
    """Per pair, the cross-fitted TF-IDF probe's margin for HH's chosen response."""
    from fedsim_tasks.hh_preference.selector import TfidfScorer

    order = np.random.default_rng(PROBE_FOLDS.seed(seed)).permutation(len(pairs))
    backing = np.zeros(len(pairs))
    for held, fit in ((order[::2], order[1::2]), (order[1::2], order[::2])):
        probe = TfidfScorer(human_words=0)
        probe.train(both_orders([pairs[i] for i in fit]), 1000)
        backing[held] = probe.margins(
            both_orders([pairs[i] for i in held])[1::2]
        )  # (y_l, y_w): s(y_w) - s(y_l)
    return backing


def minority_clients(num_clients: int, share: float, seed: int) -> list[int]:
    """The seeded ``round(share * M)`` clients whose labels follow the other preference."""
    count = int(round(share * num_clients))
    return sorted(
        np.random.default_rng(MINORITY.seed(seed))
        .choice(num_clients, count, replace=False)
        .tolist()
    )


def holdout(
    pairs: list[Pair], share: float, seed: int, partition_id: int
) -> tuple[list[Pair], list[Pair]]:
    """A client's own (train, validation) pairs: a seeded ``share`` (at least one) held out."""
    order = np.random.default_rng(HOLDOUT.seed(seed, partition=partition_id)).permutation(
        len(pairs)
    )
    n_val = max(1, int(round(share * len(pairs)))) if len(pairs) > 1 else 0
    return [pairs[i] for i in order[n_val:]], [pairs[i] for i in order[:n_val]]


@dataclass(frozen=True)
class ClientData:
    """One client's own pairs, labelled by its population's preference."""

    partition_id: int
    minority: bool
    train: list[Example]
    valid: list[Example]

    @property
    def population(self) -> str:
        return "minority" if self.minority else "majority"


class Federation:
    """Splits, topics, partitions and populations of one task config (``conf/task/hh_rlhf.yaml``),
    the same in every process that builds it: clients read their own part, the server's
    protocol the held-out parts (and, for the non-private references only, every client's)."""

    def __init__(self, task: dict, data_root: str):
        pairs = load_pairs(data_root)
        if task.get("max_pairs"):
            pairs = pairs[: task["max_pairs"]]
        self.task = task
        self.splits = split_pairs(pairs, task["splits"], task["split_seed"])
        self.pool_topics = _cached_topics(
            data_root,
            task["topic_model"],
            task["n_topics"],
            task["split_seed"],
            task.get("max_pairs"),
            tuple(task["splits"].items()),
        )
        self.num_clients = int(task["partitioner"]["num_partitions"])
        self.minority = minority_clients(
            self.num_clients, task["minority_share"], task["split_seed"]
        )
        self.labels = population_labels(pairs, task)
        self.flips = self.labels["minority"][1]

    def client(self, partition_id: int) -> ClientData:
        partitioner = instantiate_allowed(self.task["partitioner"], "task.partitioner")
        own = client_partition(self.splits["pool"], self.pool_topics, partitioner, partition_id)
        minority = partition_id in self.minority
        ties, flipped = self.labels["minority" if minority else "majority"]
        own = [p for p in own if p.pair_id not in ties]  # a tie teaches nothing: dropped, counted
        train, valid = holdout(own, self.task["valid_share"], self.task["split_seed"], partition_id)
        return ClientData(
            partition_id, minority, both_orders(train, flipped), both_orders(valid, flipped)
        )

    def test(self, population: str = "majority") -> list[Example]:
        """The held-out test pairs in both orders, labelled by ``population``'s preference (the
        majority's is HH's or its rule's); the pairs its rule ties are left out."""
        ties, flipped = self.labels[population]
        return both_orders([p for p in self.splits["test"] if p.pair_id not in ties], flipped)

    def ties(self) -> dict:
        """Per population, how many pairs its labels tie (dropped) in each split."""
        return {
            population: {
                split: sum(p.pair_id in ties for p in pairs) for split, pairs in self.splits.items()
            }
            for population, (ties, _) in self.labels.items()
        }


def population_labels(pairs, task: dict) -> dict[str, tuple[frozenset[int], frozenset[int]]]:
    """Per population, (ties, flips): the pair ids its labels drop and those it labels HH's
    rejected reply as preferred. With ``task.rules`` each population's rule labels every pair
    (:func:`~fedsim_tasks.hh_preference.rules.rule_labels`); without, the majority keeps HH's
    label and the minority flips :func:`minority_flips`'s pairs, nothing tied."""
    if task.get("rules"):
        from fedsim_tasks.hh_preference.rules import rule_labels

        return {
            population: rule_labels(
                pairs, instantiate_allowed(spec, f"task.rules.{population}", seed=0)
            )
            for population, spec in task["rules"].items()
        }
    flips = minority_flips(pairs, task["minority_preference"], task["split_seed"])
    return {"majority": (frozenset(), frozenset()), "minority": (frozenset(), flips)}


@lru_cache(maxsize=4)
def _cached_topics(
    data_root: str, model: str, n_topics: int, seed: int, max_pairs, sizes
) -> np.ndarray:
    """Topics of the pool, once per process (every client of a Ray actor shares them)."""
    pairs = load_pairs(data_root)[:max_pairs] if max_pairs else load_pairs(data_root)
    return topics(split_pairs(pairs, dict(sizes), seed)["pool"], model, n_topics, seed)
