"""The ``task`` block of Topical-Chat evidence routing, typed (``conf/task/topical_chat.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.run.schema import TaskSettings


@dataclass(frozen=True, kw_only=True)
class TopicalChatSettings(TaskSettings):
    splits: list[str]
    prior_splits: list[str]
    tune_splits: list[str]
    test_splits: list[str]
    max_per_split: int | None
