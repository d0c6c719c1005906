"""Reply validators for :class:`fedsim.messaging.Policy`: each returns why a reply's content is
malformed, or None. Flower's strategies either crash on an inconsistent reply
(``InconsistentMessageReplies``) or average whatever arrives, NaN included; a phase that names
one of these leaves such replies out and counts them instead."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from fedsim.messaging import Validator


def vector_rows(key: str, dim: int, nonnegative: bool, max_rows: int | None = None) -> Validator:
    """Accept a reply whose one ArrayRecord holds ``key``: a finite (rows, dim) matrix of at most
    ``max_rows`` rows."""

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
        if max_rows is not None and rows.shape[0] > max_rows:
            return f"{rows.shape[0]} rows, at most {max_rows} allowed"
        if not np.all(np.isfinite(rows)):
            return "non-finite values (NaN/Inf)"
        if nonnegative and np.any(rows < 0):
            return "negative mass"
        return None

    return check


MAX_EXAMPLES = 1_000_000  # a FedAvg weight above this is a lie: no client here holds that many


def _weight_problem(content: RecordDict) -> str | None:
    """FedAvg multiplies each update by the reply's ``num-examples``: it must be a whole number
    in [1, MAX_EXAMPLES] (NaN, 1e12 or a negative weight would let one reply set the model)."""
    for record in content.metric_records.values():
        if "num-examples" in record:
            n = record["num-examples"]
            if not isinstance(n, (int, float)) or not np.isfinite(n) or n != int(n) \
                    or not 1 <= n <= MAX_EXAMPLES:
                return f"num-examples={n!r} is not a whole number in [1, {MAX_EXAMPLES}]"
    return None


def _array_problem(name: str, array, like=None) -> str | None:
    try:
        values = array.numpy()
    except Exception as exc:  # undecodable payload
        return f"undecodable array {name}: {exc}"
    if like is not None and (values.shape != tuple(like.shape) or values.dtype != np.dtype(like.dtype)):
        return f"{name}: {values.dtype}{values.shape}, sent {like.dtype}{tuple(like.shape)}"
    if not np.all(np.isfinite(values)):
        return f"non-finite values (NaN/Inf) in {name}"
    return None


def finite_arrays(content: RecordDict) -> str | None:
    """Accept a reply carrying one non-empty ArrayRecord of finite arrays (model weights) and,
    where it has one, a plausible FedAvg weight."""
    records = list(content.array_records.values())
    if len(records) != 1 or not len(records[0]):
        return "expected one non-empty ArrayRecord"
    for name, array in records[0].items():
        if why := _array_problem(name, array):
            return why
    return _weight_problem(content)


def model_reply(sent: ArrayRecord) -> Validator:
    """Accept a reply whose one ArrayRecord has exactly the keys, shapes and dtypes of the model
    ``sent`` (an array of another shape would be broadcast into the average by ``+=``; a
    missing key would silently keep the old weights), finite values and a plausible weight."""
    like = {name: array for name, array in sent.items()}

    def check(content: RecordDict) -> str | None:
        records = list(content.array_records.values())
        if len(records) != 1:
            return "expected one ArrayRecord"
        if set(records[0]) != set(like):
            missing, extra = sorted(set(like) - set(records[0])), sorted(set(records[0]) - set(like))
            return f"arrays differ from the model sent: missing {missing[:3]}, extra {extra[:3]}"
        for name, array in records[0].items():
            if why := _array_problem(name, array, like[name]):
                return why
        return _weight_problem(content)

    return check


def finite_metrics(required: Iterable[str]) -> Validator:
    """Accept a reply with one MetricRecord holding every ``required`` key as a finite number
    (an evaluation's reply: one NaN would make the mean over clients NaN, a missing key a
    KeyError after the exchange)."""
    required = list(required)

    def check(content: RecordDict) -> str | None:
        records = list(content.metric_records.values())
        if len(records) != 1:
            return "expected one MetricRecord"
        missing = [k for k in required if k not in records[0]]
        if missing:
            return f"metrics missing: {missing[:3]}"
        bad = [k for k in required if not isinstance(records[0][k], (int, float)) or not np.isfinite(records[0][k])]
        return f"metrics not a finite number: {bad[:3]}" if bad else None

    return check
