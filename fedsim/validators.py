"""Reply validators for :class:`fedsim.messaging.Policy`: each returns why a reply's content is
malformed, or None. Flower's strategies either crash on an inconsistent reply
(``InconsistentMessageReplies``) or average whatever arrives, NaN included; a phase that names
one of these leaves such replies out and counts them instead."""

from __future__ import annotations

import numpy as np
from flwr.app import RecordDict

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


def finite_arrays(content: RecordDict) -> str | None:
    """Accept a reply carrying one non-empty ArrayRecord of finite arrays (model weights)."""
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
