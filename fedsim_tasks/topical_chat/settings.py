"""The ``task`` blocks of the Topical-Chat tasks, typed (``conf/task/topical_chat.yaml``,
``conf/task/turn_sentiment.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.config.schema import TaskSettings, require
from fedsim_tasks.topical_chat.dataset import SENTIMENTS, SPLITS


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
    classes: dict[str, list[str]]
    batch_size: int
    lr: float

    def __post_init__(self):
        super().__post_init__()
        for name in ("features", "hidden", "batch_size"):
            require(getattr(self, name) >= 1, f"task.{name}", ">= 1", getattr(self, name))
        held = sorted(s for sentiments in self.classes.values() for s in sentiments)
        require(
            len(self.classes) >= 2 and held == sorted(SENTIMENTS),
            "task.classes",
            f"2 or more classes holding each of the sentiments {list(SENTIMENTS)} exactly once",
            self.classes,
        )
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
