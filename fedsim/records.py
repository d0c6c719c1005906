"""Named numpy arrays to and from Flower's ArrayRecord (the weights every message carries)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}
