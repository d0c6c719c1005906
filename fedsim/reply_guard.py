"""Fault isolation for any Flower strategy: bad replies are left out and counted, not fatal.

Flower's strategies either crash on an inconsistent reply (``InconsistentMessageReplies``) or
average whatever arrives, NaN included. ``ReplyGuard`` wraps a strategy, drops replies that carry
an error (the ClientApp raised), that never arrived (timeout) or that fail a validator, and adds
the counts to the round's metrics, so the run completes and says what it left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

log = logging.getLogger("fedsim")

Validator = Callable[[RecordDict], "str | None"]  # returns the reason a reply is malformed


def vector_rows_validator(key: str, dim: int, nonnegative: bool) -> Validator:
    """Accept a reply whose ArrayRecord holds ``key``: a finite (rows, dim) matrix."""

    def check(content: RecordDict) -> str | None:
        records = list(content.array_records.values())
        if len(records) != 1 or key not in records[0]:
            return f"expected one ArrayRecord holding {key!r}"
        try:
            rows = records[0][key].numpy()
        except Exception as exc:  # undecodable payload
            return f"undecodable array: {exc}"
        if rows.ndim != 2 or rows.shape[1] != dim or rows.shape[0] == 0:
            return f"wrong shape {rows.shape}, expected (n>=1, {dim})"
        if not np.all(np.isfinite(rows)):
            return "non-finite values (NaN/Inf)"
        if nonnegative and np.any(rows < 0):
            return "negative mass"
        return None

    return check


def finite_arrays_validator(content: RecordDict) -> str | None:
    """Accept a reply carrying one ArrayRecord of finite arrays (model weights)."""
    records = list(content.array_records.values())
    if len(records) != 1 or not len(records[0]):
        return "expected one non-empty ArrayRecord"
    for name, array in records[0].items():
        try:
            values = array.numpy()
        except Exception as exc:  # undecodable payload
            return f"undecodable array {name}: {exc}"
        if not np.all(np.isfinite(values)):
            return f"non-finite values (NaN/Inf) in {name}"
    return None


class ReplyGuard(Strategy):
    """Wraps ``strategy``; the fault counts land in each round's train / evaluate metrics."""

    def __init__(self, strategy: Strategy, validator: Validator | None = None):
        self.strategy = strategy
        self.validator = validator
        self.faults: dict[str, dict[int, dict[str, int]]] = {}
        self._sent = {"train": 0, "evaluate": 0}
        self._round_start = 0.0
        self.cost: dict[int, dict[str, float]] = {}  # per train round: seconds and bytes

    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._round_start = time.perf_counter()
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        self._sent["train"] = len(messages)
        return messages

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        messages = list(self.strategy.configure_evaluate(server_round, arrays, config, grid))
        self._sent["evaluate"] = len(messages)
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        good, counts = self.screen("train", server_round, replies, self.validator)
        start = time.perf_counter()
        arrays, metrics = self.strategy.aggregate_train(server_round, good) if good else (None, None)
        cost = {"aggregate-seconds": time.perf_counter() - start,
                "bytes-up-per-client": (sum(_array_bytes(m.content) for m in good) / len(good)
                                        if good else 0),
                "round-seconds": time.perf_counter() - self._round_start}
        self.cost[server_round] = cost
        out = _with_counts(metrics, counts)
        out.update(cost)
        return arrays, out

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]):
        if not self._sent["evaluate"]:  # the strategy evaluates nothing itself
            return None
        good, counts = self.screen("evaluate", server_round, replies, None)
        metrics = self.strategy.aggregate_evaluate(server_round, good) if good else None
        return _with_counts(metrics, counts)

    def screen(self, phase: str, server_round: int, replies: Iterable[Message],
               validator: Validator | None, sent: int | None = None):
        """Split replies into usable ones and fault counts (also kept in ``self.faults``)."""
        replies = list(replies)
        good, counts = [], {"sent": self._sent.get(phase, 0) if sent is None else sent,
                            "failed": 0, "malformed": 0}
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                counts["failed"] += 1
                log.warning("%s round %d: node %s failed: %s", phase, server_round, node,
                            msg.error.reason)
            elif validator and (reason := validator(msg.content)):
                counts["malformed"] += 1
                log.warning("%s round %d: node %s rejected: %s", phase, server_round, node, reason)
            else:
                good.append(msg)
        counts["timed_out"] = max(0, counts["sent"] - len(replies))
        counts["accepted"] = len(good)
        counts["examples"] = int(sum(_num_examples(m.content) for m in good))
        if counts["timed_out"]:
            log.warning("%s round %d: %d node(s) did not reply in time", phase, server_round,
                        counts["timed_out"])
        self.faults.setdefault(phase, {})[server_round] = counts
        return good, counts


def _num_examples(content: RecordDict) -> float:
    """FedAvg's weight key: how many clients / examples a reply stands for (1 if absent)."""
    for record in content.metric_records.values():
        if "num-examples" in record:
            return float(record["num-examples"])
    return 1.0


def _array_bytes(content: RecordDict) -> int:
    return sum(len(a.data) for record in content.array_records.values() for a in record.values())


def _with_counts(metrics: MetricRecord | None, counts: dict[str, int]) -> MetricRecord:
    out = MetricRecord() if metrics is None else metrics
    for key, value in counts.items():
        out[f"replies-{key}"] = value
    return out
