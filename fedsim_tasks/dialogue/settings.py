"""The ``task`` block of dialogue generation, typed (``conf/task/dialogue.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.config.schema import TaskSettings


@dataclass(kw_only=True)
class DialogueDataset:
    """One dataset's data and clients. Not frozen: OmegaConf makes a frozen dataclass's nodes
    read-only, and a mapping of them (``datasets``) could then not be filled from the YAML."""

    loader: str
    train_split: str
    eval_split: str
    reply_speakers: list[str] | None
    grounding_role: str
    partitioner: dict


@dataclass(frozen=True, kw_only=True)
class Contamination:
    clients: list[int]
    share: float


@dataclass(frozen=True, kw_only=True)
class TrustData:
    contexts_per_client: int
    labels: dict[str, float]


@dataclass(frozen=True, kw_only=True)
class DialogueSettings(TaskSettings):
    units = ("client",)  # a client-round belongs to one client
    seed: int
    num_clients: int
    split_seed: int
    max_conversations: int | None
    context_turns: int
    grounding_words: int
    valid_share: float
    datasets: dict[str, DialogueDataset | None]
    """name -> its data and clients (null: a preset leaves it out)"""
    contamination: Contamination
    trust: TrustData
    evaluator: dict
