"""The ``task`` block of HH-RLHF preference pairs, typed (``conf/task/hh_rlhf.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.schema import TaskSettings


@dataclass(frozen=True, kw_only=True)
class HHRLHFSettings(TaskSettings):
    selector: dict
    """the selector entry (``conf/task/selector/*.yaml``: its ``_target_`` and settings)"""
    seed: int
    max_pairs: int | None
    splits: dict[str, int]
    split_seed: int
    topic_model: str
    n_topics: int
    partitioner: dict
    valid_share: float
    minority_share: float
    judge: dict
