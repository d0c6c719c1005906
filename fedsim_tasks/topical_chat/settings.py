"""The ``task`` blocks of the Topical-Chat tasks, typed (``conf/task/topical_chat.yaml``,
``conf/task/turn_sentiment.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.config.schema import TaskSettings, require
from fedsim_tasks.topical_chat.dataset import SPLITS


@dataclass(frozen=True, kw_only=True)
class TopicalChatSettings(TaskSettings):
    units = ("conversation",)  # a turn belongs to one conversation, the client
    splits: list[str]
    prior_splits: list[str]
    tune_splits: list[str]
    test_splits: list[str]
    max_per_split: int | None
    split_seed: int | None


@dataclass(frozen=True, kw_only=True)
class TurnSentimentSettings(TaskSettings):
    units = ("client",)
    train_splits: list[str]
    test_splits: list[str]
    features: int
    hidden: int
    batch_size: int
    lr: float

    def __post_init__(self):
        super().__post_init__()
        for name in ("features", "hidden", "batch_size"):
            require(getattr(self, name) >= 1, f"task.{name}", ">= 1", getattr(self, name))
        require(self.lr > 0, "task.lr", "> 0", self.lr)
        for key in ("train_splits", "test_splits"):
            require(
                set(getattr(self, key)) <= set(SPLITS),
                f"task.{key}",
                f"splits of {SPLITS}",
                getattr(self, key),
            )
        require(
            not set(self.train_splits) & set(self.test_splits),
            "task.test_splits",
            "no split of task.train_splits",
            self.test_splits,
        )
