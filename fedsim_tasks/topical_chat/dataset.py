"""Topical-Chat loading: grounded turns, candidates and gold evidence (METHODS.md section 1).

A grounded turn is one whose ``knowledge_source`` names FS1, FS2 or FS3; its gold evidence is
the speaker's reading-set entry for the first FS label in that list, and its candidates are the
speaker's FS1-FS3 entries. Each entry points at one of the 516 wiki lead sections (the topic
space) by id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedsim.config.data import require_file
from fedsim.seeding import stream

UPSTREAM = "github.com/alexa/Topical-Chat (CDLA-Sharing 1.0)"
SPLITS = ("valid_freq", "valid_rare", "test_freq", "test_rare")
SENTIMENTS = (
    "Curious to dive deeper",
    "Neutral",
    "Surprised",
    "Happy",
    "Sad",
    "Disgusted",
    "Angry",
    "Fearful",
)  # the sentiments a turn's writer annotated it with
POOLS = {
    "freq": ("valid_freq", "test_freq"),
    "rare": ("valid_rare", "test_rare"),
}  # what a split_seed redraws
SPLIT_DRAW = stream(
    "topical-chat-split", "frequency"
)  # which pooled conversations are valid, which test
FS_LABELS = ("FS1", "FS2", "FS3")
WIKI_KEYS = ("shortened_wiki_lead_section", "summarized_wiki_lead_section")


@dataclass(frozen=True)
class Turn:
    message: str
    gold: int  # topic index of the gold evidence, -1 if the turn is not FS-grounded
    candidates: tuple[int, ...]  # the speaker's FS1-FS3 topic indices


@dataclass(frozen=True)
class Conversation:
    conversation_id: str
    split: str
    turns: tuple[Turn, ...]

    @property
    def half(self) -> int:
        """Turns with index < n // 2 form the first half."""
        return len(self.turns) // 2


@dataclass(frozen=True)
class Topics:
    """The 516 evidence texts, indexed 0..515 in wiki.json order."""

    texts: tuple[str, ...]
    index: dict  # wiki section id -> topic index

    def __len__(self) -> int:
        return len(self.texts)


@lru_cache(maxsize=4)
def load_topics(data_root: str) -> Topics:
    path = require_file(Path(data_root) / "topical_chat" / "wiki.json", UPSTREAM)
    wiki = json.loads(path.read_text())
    texts, index = [], {}
    for key in WIKI_KEYS:
        for text, section_id in wiki[key].items():
            index[int(section_id)] = len(texts)
            texts.append(text)
    return Topics(tuple(texts), index)


def _speaker_topic(entry: dict, topics: Topics) -> int:
    for key in WIKI_KEYS:
        if key in entry:
            return topics.index[int(entry[key])]
    raise ValueError(f"reading-set entry has no wiki lead section: {sorted(entry)}")


def _parse(cid: str, split: str, conv: dict, reading: dict, topics: Topics) -> Conversation:
    turns = []
    for turn in conv["content"]:
        agent_set = reading[turn["agent"]]
        candidates = tuple(_speaker_topic(agent_set[fs], topics) for fs in FS_LABELS)
        grounded = [s for s in turn["knowledge_source"] if s in FS_LABELS]
        gold = candidates[FS_LABELS.index(grounded[0])] if grounded else -1
        turns.append(Turn(turn["message"], gold, candidates))
    return Conversation(cid, split, tuple(turns))


@lru_cache(maxsize=16)
def load_split(
    data_root: str, split: str, limit: int | None = None, split_seed: int | None = None
) -> tuple[Conversation, ...]:
    """The conversations of one split in file order, the first ``limit`` if set (parsing is most
    of the cost: a deployment's client loads its data in every message's process).
    ``split_seed`` None: the published split; an int: the split's share of its frequency's
    pooled valid + test conversations, redrawn (:func:`redrawn_rows`)."""
    if split not in SPLITS:
        raise ValueError(f"unknown Topical-Chat split {split!r}; available here: {SPLITS}")
    if split_seed is not None:
        frequency = split.rsplit("_", 1)[1]
        published = [load_split(data_root, source) for source in POOLS[frequency]]
        pooled = [c for part in published for c in part]
        rows = redrawn_rows([len(part) for part in published], split_seed, frequency)[
            POOLS[frequency].index(split)
        ]
        return tuple(replace(pooled[i], split=split) for i in rows[:limit])
    root = Path(data_root) / "topical_chat"
    convs = json.loads(require_file(root / "conversations" / f"{split}.json", UPSTREAM).read_text())
    reading = json.loads(
        require_file(root / "reading_sets" / f"{split}.json", UPSTREAM).read_text()
    )
    topics = load_topics(data_root)
    return tuple(
        _parse(cid, split, c, reading[cid], topics) for cid, c in list(convs.items())[:limit]
    )


def redrawn_rows(sizes: list[int], split_seed: int, frequency: str) -> list[list[int]]:
    """Rows of the pooled conversations (valid's then test's, in file order) that each split of
    ``frequency`` holds after the redraw: a permutation from ``split_seed`` cut at the published
    sizes, each part in pooled order. The test conversations then vary with the seed, which a
    sweep over seeds needs for an interval over test sets, not only over runs."""
    order = np.random.default_rng(SPLIT_DRAW.seed(split_seed, frequency=frequency)).permutation(
        sum(sizes)
    )
    cuts = np.cumsum(sizes)[:-1]
    return [sorted(part.tolist()) for part in np.split(order, cuts)]


@lru_cache(maxsize=16)
def load_conversations(
    data_root: str,
    splits: tuple[str, ...],
    max_per_split: int | None = None,
    split_seed: int | None = None,
) -> tuple[Conversation, ...]:
    """Conversations of ``splits`` in order, the first ``max_per_split`` of each if set (cached:
    a SuperNode hosting many clients builds each from it, and a copy per client was O(clients x
    conversations)); ``split_seed`` as in :func:`load_split`."""
    out: list[Conversation] = []
    for split in splits:
        out.extend(load_split(str(data_root), split, max_per_split, split_seed))
    return tuple(out)


def row_splits(
    data_root: str, splits: tuple[str, ...], max_per_split: int | None = None
) -> list[str]:
    """The split of each row of :func:`load_conversations`' population, from the conversation
    files alone (the server checks what the clients say they host, without parsing turns); the
    same under any ``split_seed``, which keeps each split's size."""
    root = Path(data_root) / "topical_chat" / "conversations"
    out: list[str] = []
    for split in splits:
        if split not in SPLITS:
            raise ValueError(f"unknown Topical-Chat split {split!r}; available here: {SPLITS}")
        size = len(json.loads(require_file(root / f"{split}.json", UPSTREAM).read_text()))
        out += [split] * (size if max_per_split is None else min(size, max_per_split))
    return out


def local_preference(conv: Conversation, num_topics: int) -> np.ndarray:
    """p_c: normalized histogram of the gold evidence of first-half grounded turns (uniform if none)."""
    golds = [t.gold for t in conv.turns[: conv.half] if t.gold >= 0]
    if not golds:
        return np.full(num_topics, 1.0 / num_topics)
    hist = np.bincount(golds, minlength=num_topics).astype(float)
    return hist / hist.sum()
