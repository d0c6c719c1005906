"""Turn classification on Topical-Chat: ``turn_sentiment_fedavg``'s task and the workload of
``bench/simulation_peers.py``.

Every client holds consecutive turns (from a few turns of one conversation, as a user's device
would, to the turns of a hundred conversations, as ``turn_sentiment_fedavg``'s 20 clients do)
and trains a 2-layer MLP that predicts a turn's class (the task's ``classes`` group the 8
annotated sentiments) from frozen hashed bag-of-words features of its text. The model is small
on purpose: the benchmark measures what a simulator costs per client, and every framework it
compares runs these same functions (features, partition, model, local epoch, accuracy), so the
work is equal.

Why hashed bag-of-words rather than MiniLM embeddings: MiniLM encodes ~46 turns/s on this
2-core CPU (17 min for the 46,903 turns), hashing all of them takes seconds, and the hashing
vectorizer is stateless (no vocabulary fitted on anybody's data), so every client and framework
computes the same features without sharing anything.

Why the classes group the sentiments: the writer's own 8-way label is barely predictable from
the text (a logistic regression on all 35,133 training turns, 512 hashed features, reaches 0.42
test accuracy against the majority class's 0.41; four of the classes hold about 1% of the turns
each), so a federation trained on it stays at the majority class and no strategy or privacy
setting can show a difference. Curious / neutral / any other emotion is a grouping the text
carries (the same regression: 0.50).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedsim.config.data import require_file
from fedsim.seeding import stream
from fedsim_tasks.proximal import ProximalTerm
from fedsim_tasks.topical_chat.dataset import SPLITS, UPSTREAM

MODEL_INIT = stream("turn-sentiment-init")  # of the run's seed: the same initial model everywhere
BATCH_ORDER = stream(
    "turn-sentiment-batches", "round", "partition"
)  # a client's batch order in a round


@dataclass(frozen=True)
class Turns:
    """Features and labels of the turns of some splits, in file order (conversation after conversation)."""

    x: np.ndarray  # float32 [turns, features], rows L2-normalized
    y: np.ndarray  # int64 [turns], the index of the class holding the turn's sentiment

    def __len__(self) -> int:
        return len(self.y)


Classes = tuple[tuple[str, tuple[str, ...]], ...]
"""each class's name and the annotated sentiments it holds, in label order (every sentiment in
one class: ``TurnSentimentSettings`` checks it before a run)"""

TOKENS = r"(?u)\b\w+\b|[?!]"
"""words of any length and the question and exclamation marks (scikit-learn's default drops
both and one-letter words; with them the logistic regression below gains 0.47 -> 0.50)"""


def classes_of(block: dict) -> Classes:
    """A task block's ``classes`` (a mapping of name to sentiments) as a hashable value."""
    return tuple((str(name), tuple(held)) for name, held in block.items())


def _conversations(data_root: str, split: str) -> list[dict]:
    """The conversations of one Topical-Chat split, in file order."""
    if split not in SPLITS:
        raise ValueError(f"unknown Topical-Chat split {split!r}; available here: {SPLITS}")
    path = require_file(
        Path(data_root) / "topical_chat" / "conversations" / f"{split}.json", UPSTREAM
    )
    return list(json.loads(path.read_text()).values())


@lru_cache(maxsize=4)
def count_turns(data_root: str, splits: tuple[str, ...]) -> int:
    """How many turns ``splits`` hold: what a client's rows need (:func:`client_rows`), without
    hashing 35,000 texts (3.5 s) on a server that only checks each client's count."""
    return sum(len(c["content"]) for split in splits for c in _conversations(data_root, split))


@lru_cache(maxsize=4)
def load_turns(data_root: str, splits: tuple[str, ...], features: int, classes: Classes) -> Turns:
    """The turns of ``splits``: hashed unigram + bigram counts (scikit-learn's stateless
    HashingVectorizer over :data:`TOKENS`, ``features`` buckets, L2-normalized) and the label
    of the class holding the turn's annotated sentiment."""
    from sklearn.feature_extraction.text import HashingVectorizer

    label_of = {s: i for i, (_, held) in enumerate(classes) for s in held}
    texts, labels = [], []
    for split in splits:
        for conversation in _conversations(data_root, split):
            for turn in conversation["content"]:
                texts.append(turn["message"])
                labels.append(label_of[turn["sentiment"]])
    hashing = HashingVectorizer(
        n_features=features,
        ngram_range=(1, 2),
        alternate_sign=False,
        norm="l2",
        token_pattern=TOKENS,
    )
    x = hashing.transform(texts).astype(np.float32).toarray()
    return Turns(x, np.asarray(labels, dtype=np.int64))


def client_rows(num_turns: int, num_clients: int, client: int) -> np.ndarray:
    """Client ``client``'s rows of ``num_clients``: consecutive turns in file order, sizes
    differing by at most one (each a slice of one or two conversations)."""
    if not 0 < num_clients <= num_turns:
        raise ValueError(f"{num_clients} clients over {num_turns} turns: each client needs a turn")
    if not 0 <= client < num_clients:
        raise ValueError(f"client {client} is not one of {num_clients}")
    bounds = np.linspace(0, num_turns, num_clients + 1).round().astype(int)
    return np.arange(bounds[client], bounds[client + 1])


def build_mlp(features: int, hidden: int, classes: int, seed: int) -> nn.Module:
    """The 2-layer MLP, initialized from ``seed`` (the same weights in every framework)."""
    generator = torch.Generator().manual_seed(seed)
    model = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.rand(p.shape, generator=generator) * 2 - 1) / np.sqrt(p.shape[-1]))
    return model


def epoch_batches(n: int, batch_size: int, seed: int) -> list[np.ndarray]:
    """One epoch's batches over ``n`` examples: their indices in a seeded order, ``batch_size``
    at a time (the last one shorter)."""
    order = np.random.default_rng(seed).permutation(n)
    return [order[start : start + batch_size] for start in range(0, n, batch_size)]


def train_epoch(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int,
    lr: float,
    seed: int,
    mu: float = 0.0,
) -> dict:
    """One local epoch of SGD over ``x, y`` in a seeded order (FedProx's term at ``mu``)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    proximal = ProximalTerm(model, mu)
    total, steps = 0.0, 0
    for batch in epoch_batches(len(y), batch_size, seed):
        loss = nn.functional.cross_entropy(
            model(torch.from_numpy(x[batch])), torch.from_numpy(y[batch])
        )
        optimizer.zero_grad()
        proximal(loss).backward()
        optimizer.step()
        total, steps = total + float(loss.detach()) * len(batch), steps + 1
    return {"loss": total / max(len(y), 1), "steps": steps}


def train_epochs(
    model: nn.Module,
    weights: list[np.ndarray],
    batches: list[list[tuple[np.ndarray, np.ndarray]]],
    lr: float,
    mu: float,
    size: int,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Many clients' epochs at once, each from ``weights``: client ``c`` takes one SGD step on
    each of its ``batches[c]`` (rows, labels), as :func:`train_epoch` does for one client. Step
    ``s`` of every client runs as one batched call (``torch.func.vmap``) over ``size`` rows a
    client (at least its largest batch), the rows past a client's batch masked out, and a
    client with fewer steps has its later ones masked out too (zero gradient). Returns each
    weight tensor stacked over the clients and each client's summed batch losses. Equal to the
    per-client loop to float order, not to the bit (batched matrix products add in another
    order); a client's result is the same to the bit whoever else is in the call (each
    client's products have the same shapes). FedProx's term is written out here:
    :class:`~fedsim_tasks.proximal.ProximalTerm` anchors a module's own parameters, and these
    are per-client tensors passed to ``functional_call``."""
    from torch.func import functional_call, grad, vmap

    names = list(dict(model.named_parameters()))
    anchor = [torch.from_numpy(np.asarray(w)) for w in weights]

    def loss(params, x, y, m):
        logits = functional_call(model, dict(zip(names, params)), (x,))
        ce = (nn.functional.cross_entropy(logits, y, reduction="none") * m).sum()
        taken = m.sum()
        near = sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))
        return ce / taken.clamp(min=1) + (taken > 0) * mu / 2 * near, ce

    step = vmap(grad(loss, has_aux=True))
    clients, width = len(batches), max(len(b) for b in batches)
    params = [a.unsqueeze(0).repeat(clients, *[1] * a.dim()) for a in anchor]
    losses = torch.zeros(clients)
    for s in range(width):
        x = torch.zeros(clients, size, batches[0][0][0].shape[1])
        y = torch.zeros(clients, size, dtype=torch.int64)
        m = torch.zeros(clients, size)
        for c, held in enumerate(batches):
            if s < len(held):
                rows, labels = held[s]
                x[c, : len(labels)], y[c, : len(labels)] = (
                    torch.from_numpy(rows),
                    torch.from_numpy(labels),
                )
                m[c, : len(labels)] = 1
        grads, ce = step(params, x, y, m)
        params = [p - lr * g for p, g in zip(params, grads)]
        losses += ce
    return [p.detach().numpy() for p in params], losses.numpy()


@torch.no_grad()
def evaluate(model: nn.Module, turns: Turns) -> dict:
    """Accuracy, balanced accuracy (the mean of the classes' recalls: 1 / classes for a model
    that predicts one class), macro-F1 and mean cross-entropy on ``turns``."""
    from sklearn.metrics import balanced_accuracy_score, f1_score

    logits = model(torch.from_numpy(turns.x))
    predicted = logits.argmax(1).numpy()
    return {
        "accuracy": float((predicted == turns.y).mean()),
        "balanced_accuracy": float(balanced_accuracy_score(turns.y, predicted)),
        "macro_f1": float(f1_score(turns.y, predicted, average="macro", zero_division=0)),
        "loss": float(nn.functional.cross_entropy(logits, torch.from_numpy(turns.y))),
    }


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """The model's tensors in ``state_dict`` order (what every framework averages)."""
    return [v.detach().cpu().numpy().copy() for v in model.state_dict().values()]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    keys = list(model.state_dict())
    if len(weights) != len(keys):
        raise ValueError(f"{len(weights)} arrays for a model of {len(keys)} tensors")
    model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights)})


@dataclass(frozen=True)
class Recipe:
    """The whole workload as one value: data, model and local training. A framework runs
    ``initial``, then per round and sampled client ``local_update``, averages the replies
    weighted by their examples, and ``evaluate``s the average: nothing else is left to it."""

    data_root: str
    train_splits: tuple[str, ...]  # the clients' turns
    test_splits: tuple[str, ...]  # the server's held-out turns
    features: int  # hashing buckets
    hidden: int  # MLP hidden units
    classes: Classes  # the label: each class and the annotated sentiments it holds
    batch_size: int  # examples per SGD step (one epoch: a few steps per client)
    lr: float  # SGD learning rate

    @classmethod
    def of(cls, task: dict, data_root: str) -> Recipe:
        """The recipe of a ``task`` block (``conf/task/turn_sentiment.yaml``, its values)."""
        return cls(
            str(data_root),
            tuple(task["train_splits"]),
            tuple(task["test_splits"]),
            int(task["features"]),
            int(task["hidden"]),
            classes_of(task["classes"]),
            int(task["batch_size"]),
            float(task["lr"]),
        )

    def train_turns(self) -> Turns:
        return load_turns(self.data_root, self.train_splits, self.features, self.classes)

    def test_turns(self) -> Turns:
        return load_turns(self.data_root, self.test_splits, self.features, self.classes)

    def model(self, weights: list[np.ndarray] | None = None, seed: int = 0) -> nn.Module:
        model = build_mlp(self.features, self.hidden, len(self.classes), MODEL_INIT.seed(seed))
        if weights is not None:
            set_weights(model, weights)
        return model

    def initial(self, seed: int) -> list[np.ndarray]:
        return get_weights(self.model(seed=seed))

    def examples(self, client: int, num_clients: int) -> int:
        return len(client_rows(count_turns(self.data_root, self.train_splits), num_clients, client))

    def local_update(
        self,
        weights: list[np.ndarray],
        client: int,
        num_clients: int,
        seed: int,
        server_round: int,
        mu: float = 0.0,
    ) -> tuple[list[np.ndarray], int, dict]:
        """Client ``client``'s epoch from ``weights`` in ``server_round`` (1-based): its new
        weights, its examples and its metrics."""
        turns = self.train_turns()
        rows = client_rows(len(turns), num_clients, client)
        model = _worker_model(self.features, self.hidden, len(self.classes))
        set_weights(model, weights)
        order_seed = BATCH_ORDER.seed(seed, round=server_round, partition=client)
        metrics = train_epoch(
            model, turns.x[rows], turns.y[rows], self.batch_size, self.lr, order_seed, mu
        )
        return get_weights(model), len(rows), metrics

    def local_updates(
        self,
        weights: list[np.ndarray],
        clients: list[int],
        num_clients: int,
        seed: int,
        server_round: int,
        mu: float = 0.0,
    ) -> tuple[list[np.ndarray], list[int], list[float]]:
        """:meth:`local_update` of several clients from the same ``weights`` as one batched
        computation (:func:`train_epochs`, every step over ``batch_size`` rows: a client's
        result is the same to the bit whichever clients share the call): each weight tensor
        stacked over ``clients``, their examples and mean losses. What the batched backend runs
        for a SuperNode's clients (``fedsim_clients/turn_sentiment.py``;
        ``bench/vectorized_clients.py`` times it against the loop)."""
        turns, batches, examples = self.train_turns(), [], []
        for client in clients:
            rows = client_rows(len(turns), num_clients, client)
            x, y = turns.x[rows], turns.y[rows]
            seed_of = BATCH_ORDER.seed(seed, round=server_round, partition=client)
            batches.append(
                [(x[b], y[b]) for b in epoch_batches(len(rows), self.batch_size, seed_of)]
            )
            examples.append(len(rows))
        model = _worker_model(self.features, self.hidden, len(self.classes))
        stacked, losses = train_epochs(model, weights, batches, self.lr, mu, self.batch_size)
        return stacked, examples, [float(t) / max(n, 1) for t, n in zip(losses, examples)]

    def evaluate(self, weights: list[np.ndarray]) -> dict:
        return evaluate(self.model(weights), self.test_turns())


@lru_cache(maxsize=1)
def _worker_model(features: int, hidden: int, classes: int) -> nn.Module:
    """One MLP per process that every client's epoch loads its weights into (as pfl keeps one
    model per worker): building one per client (initialized, then overwritten) was 3/4 of a
    client's time here. Every tensor is overwritten before use, so nothing carries over."""
    return build_mlp(features, hidden, classes, 0)


WEIGHT_NAMES = tuple(build_mlp(1, 1, 1, 0).state_dict())
"""the MLP's tensors in ``state_dict`` order: the names they travel under in fedsim's records"""
