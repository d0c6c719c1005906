"""Dialogue corpora as (context, next reply) examples, and their clients.

Synthetic-Persona-Chat (SPC; grounding: the replying user's persona) and CMU_DoG (grounding:
the section of the movie's Wikipedia document the turn was about) are FedDTRE's tasks;
Topical-Chat teaches the base model to answer. A conversation is a list of turns; each reply of
a ``reply_speakers`` speaker becomes one example whose prompt is the grounding and the last
``context_turns`` turns, the replying speaker as ``Assistant`` and the other as ``Human``
(:func:`fedsim_tasks.causal_lm.format_prompt`). Consecutive turns of one speaker are joined.

Clients: the conversations of a split are rows of a table whose ``group`` column is the
conversation group (SPC: the replying user's persona; CMU_DoG: the movie), split by the
configured flwr-datasets partitioner (by default ``GroupedNaturalIdPartitioner``: whole groups
per client). Each client holds out ``valid_share`` of its conversations: the contexts on which
FedDTRE scores its local and the global model.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from datasets import Dataset

from fedsim.code_policy import allowed_code, instantiate_allowed
from fedsim.config.data import DataNotFoundError, require_file
from fedsim.seeding import stream
from fedsim_tasks.causal_lm import format_prompt, generate

SPC_UPSTREAM = "github.com/google-research-datasets/Synthetic-Persona-Chat (CC BY 4.0)"
CMU_DOG_UPSTREAM = "github.com/festvox/datasets-CMU_DoG"
TOPICAL_CHAT_UPSTREAM = "github.com/alexa/Topical-Chat (CDLA-Sharing 1.0)"


@dataclass(frozen=True)
class Turn:
    speaker: str
    text: str
    grounding: str  # what the speaker knew for this turn (persona, document section), "" if nothing


@dataclass(frozen=True)
class Conversation:
    conv_id: str
    group: str  # SPC: the persona of User 2; CMU_DoG: the movie; Topical-Chat: the conversation
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Example:
    prompt: str  # the generator's input: grounding and recent turns, ending with "Assistant:"
    reply: str  # the true next reply
    context: str  # the same context as plain text (the trust evaluator's X)
    conv_id: str


def _joined(turns: list[Turn]) -> tuple[Turn, ...]:
    """Consecutive turns of one speaker as one turn (CMU_DoG users often send several messages)."""
    out: list[Turn] = []
    for t in turns:
        if out and out[-1].speaker == t.speaker:
            out[-1] = Turn(t.speaker, f"{out[-1].text} {t.text}", out[-1].grounding or t.grounding)
        else:
            out.append(t)
    return tuple(out)


@lru_cache(maxsize=8)
def persona_chat(data_root: str, split: str) -> tuple[Conversation, ...]:
    """SPC ``split`` (valid | test): User 1 and User 2, each grounded on their persona lines."""
    path = require_file(Path(data_root) / "synthetic_persona_chat" / f"{split}.csv", SPC_UPSTREAM)
    out = []
    with path.open(newline="", encoding="utf-8") as fh:
        for i, row in enumerate(csv.DictReader(fh)):
            persona = {
                "User 1": " ".join(row["user 1 personas"].split()),
                "User 2": " ".join(row["user 2 personas"].split()),
            }
            turns = []
            for line in row["Best Generated Conversation"].splitlines():
                speaker, _, text = line.partition(":")
                if speaker.strip() in persona and text.strip():
                    turns.append(Turn(speaker.strip(), text.strip(), persona[speaker.strip()]))
            out.append(Conversation(f"spc-{split}-{i}", persona["User 2"], _joined(turns)))
    return tuple(out)


def _document_sections(doc: dict) -> list[str]:
    """Section 0 (the movie's facts) as text; sections 1-3 are plot text already."""
    intro = doc["0"]
    facts = [
        intro.get("movieName", ""),
        f"({intro.get('year', '')})",
        intro.get("introduction", ""),
        "Cast: " + ", ".join(intro.get("cast", [])),
        *intro.get("critical_response", []),
    ]
    return [" ".join(" ".join(facts).split())] + [
        " ".join(str(doc[str(k)]).split()) for k in (1, 2, 3)
    ]


@lru_cache(maxsize=8)
def cmu_dog(data_root: str, split: str) -> tuple[Conversation, ...]:
    """CMU_DoG ``split`` (train | valid | test): each turn grounded on the document section it was
    written about (``docIdx``); the group is the movie."""
    root = Path(data_root) / "cmu_dog"
    folder = root / "Conversations" / split
    if not folder.is_dir():
        raise DataNotFoundError(
            f"Missing data folder: {folder}. It comes from {CMU_DOG_UPSTREAM}; put the upstream "
            "files under the data root (see ../shared/data/README.md for the layout)."
        )
    documents = {}
    for path in sorted((root / "WikiData").glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        documents[int(doc["wikiDocumentIdx"])] = (
            doc["0"].get("movieName", path.stem),
            _document_sections(doc),
        )
    out = []
    for path in sorted(folder.glob("*.json")):
        conv = json.loads(path.read_text(encoding="utf-8"))
        movie, sections = documents[int(conv["wikiDocumentIdx"])]
        turns = [
            Turn(h["uid"], " ".join(h["text"].split()), sections[int(h.get("docIdx", 0))])
            for h in conv["history"]
            if h["text"].strip()
        ]
        out.append(Conversation(f"cmu-{split}-{path.stem}", movie, _joined(turns)))
    return tuple(out)


def topical_chat_file(data_root: str, split: str) -> Path:
    """Topical-Chat ``split``'s file; a missing one names its path and upstream source."""
    return require_file(
        Path(data_root) / "topical_chat" / "conversations" / f"{split}.json", TOPICAL_CHAT_UPSTREAM
    )


@lru_cache(maxsize=8)
def topical_chat(data_root: str, split: str) -> tuple[Conversation, ...]:
    """Topical-Chat ``split`` (valid_freq | valid_rare | test_freq | test_rare), ungrounded."""
    path = topical_chat_file(data_root, split)
    out = []
    for conv_id, conv in json.loads(path.read_text(encoding="utf-8")).items():
        turns = [
            Turn(t["agent"], " ".join(t["message"].split()), "")
            for t in conv["content"]
            if t["message"].strip()
        ]
        out.append(Conversation(conv_id, conv_id, _joined(turns)))
    return tuple(out)


def _words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


def examples(
    conversations,
    sep: str,
    context_turns: int,
    grounding_words: int,
    reply_speakers: list[str] | None = None,
    grounding_role: str = "Knowledge",
) -> list[Example]:
    """One example per reply of a ``reply_speakers`` speaker (None: every speaker) that follows
    another speaker's turn: the reply's grounding (its first ``grounding_words`` words; 0 leaves
    it out) and the ``context_turns`` turns before it."""
    out = []
    for conv in conversations:
        for i, turn in enumerate(conv.turns):
            if i == 0 or (reply_speakers is not None and turn.speaker not in reply_speakers):
                continue
            history = conv.turns[max(i - context_turns, 0) : i]
            roles = [
                ("Assistant" if t.speaker == turn.speaker else "Human", t.text) for t in history
            ]
            grounding = _words(turn.grounding, grounding_words) if grounding_words else ""
            lead = [(grounding_role, grounding)] if grounding else []
            out.append(
                Example(
                    format_prompt(lead + roles, sep),
                    turn.text,
                    " ".join([grounding] + [t.text for t in history]).strip(),
                    conv.conv_id,
                )
            )
    return out


def sample(examples: list, count: int, pick_seed: int) -> list:
    """``count`` examples drawn with ``pick_seed``, kept in data order (all of them if fewer)."""
    pick = np.random.default_rng(pick_seed).permutation(len(examples))[:count]
    return [examples[i] for i in sorted(pick)]


def answer_sample(
    model, tokenizer, examples: list[Example], count: int, pick_seed: int, decoding: dict, seed: int
) -> tuple[list[Example], list[str]]:
    """``count`` examples drawn with ``pick_seed`` (kept in data order) and the model's sampled
    reply to each (``decoding``: max_new_tokens, temperature, top_p; sampling seeded by ``seed``)."""
    chosen = sample(examples, count, pick_seed)
    return chosen, [
        r[0]
        for r in generate(model, tokenizer, [e.prompt for e in chosen], n=1, seed=seed, **decoding)
    ]


HELD_OUT_SPLIT = stream(
    "dialogue-held-out-split", "dataset"
)  # trust pairs / generation contexts halves
CLIENT_SPLIT = stream(
    "dialogue-client-split", "partition", "dataset"
)  # a client's train / held-out conversations


@dataclass
class ClientData:
    train: list[Conversation]
    valid: list[Conversation]  # held out locally: FedDTRE's scoring contexts


class DialogueTask:
    """One dataset of the dialogue task (``task.datasets.<name>``): its clients' conversations
    and its held-out evaluation conversations, the latter split in two disjoint halves (trust
    evaluation pairs; generation contexts)."""

    def __init__(self, name: str, spec: dict, task: dict, data_root: str):
        self.name, self.spec, self.task = name, spec, task
        load = allowed_code(spec["loader"], f"task.datasets.{name}.loader")
        limit = task.get("max_conversations")
        train = load(data_root, spec["train_split"])[:limit]
        held_out = load(data_root, spec["eval_split"])[:limit]
        partitioner = instantiate_allowed(spec["partitioner"], f"task.datasets.{name}.partitioner")
        partitioner.dataset = Dataset.from_dict(
            {"group": [c.group for c in train], "row": list(range(len(train)))}
        )
        if partitioner.num_partitions != task["num_clients"]:
            raise ValueError(
                f"{name}: the partitioner gives {partitioner.num_partitions} clients but "
                f"task.num_clients is {task['num_clients']} (set its group_size or num_clients)"
            )
        self.partitioner, self.train = partitioner, train
        order = np.random.default_rng(
            HELD_OUT_SPLIT.seed(task["split_seed"], dataset=name)
        ).permutation(len(held_out))
        half = len(order) // 2
        self.trust_heldout = [held_out[i] for i in sorted(order[:half])]
        self.test = [held_out[i] for i in sorted(order[half:])]

    def client(self, partition_id: int) -> ClientData:
        mine = self.partitioner.load_partition(partition_id)["row"]
        order = np.random.default_rng(
            CLIENT_SPLIT.seed(self.task["split_seed"], partition=partition_id, dataset=self.name)
        ).permutation(mine)
        n_valid = max(1, round(self.task["valid_share"] * len(order))) if len(order) > 1 else 0
        return ClientData(
            [self.train[i] for i in sorted(order[n_valid:])],
            [self.train[i] for i in sorted(order[:n_valid])],
        )

    def examples(self, conversations, sep: str) -> list[Example]:
        t = self.task
        return examples(
            conversations,
            sep,
            t["context_turns"],
            t["grounding_words"],
            self.spec.get("reply_speakers"),
            self.spec.get("grounding_role", "Knowledge"),
        )


def contamination(task: dict) -> tuple[frozenset[int], float]:
    """``task.contamination``: the partitions whose generator training replies leak planted PII
    and the share of their replies that do; refused unless every id is a client and the share
    lies in [0, 1] (a typo would otherwise run a clean check that looks like a result)."""
    spec = task.get("contamination") or {}
    clients, share = [int(p) for p in spec.get("clients") or []], float(spec.get("share", 0.0))
    wrong = [p for p in clients if not 0 <= p < int(task["num_clients"])]
    if wrong or len(set(clients)) != len(clients):
        raise ValueError(
            f"task.contamination.clients {clients}: distinct partition ids in "
            f"[0, {task['num_clients']}) needed (wrong: {wrong})"
        )
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"task.contamination.share must lie in [0, 1], got {share}")
    return frozenset(clients), share


def load_tasks(task: dict, data_root: str) -> dict[str, DialogueTask]:
    contamination(task)  # checked with the data, before any process starts (population_size)
    return {
        name: DialogueTask(name, spec, task, data_root)
        for name, spec in task["datasets"].items()
        if spec is not None
    }  # null: a preset's dataset turned off
