"""Named numpy arrays to and from Flower's ArrayRecord (the weights every message carries)."""

from __future__ import annotations

import io

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict


def config_record(content: RecordDict, name: str) -> ConfigRecord | None:
    """The ConfigRecord ``name`` of ``content`` (None if it holds none by that name): one lookup,
    where ``content.config_records`` builds a dict of every config record (35 us, a few times
    per client message)."""
    record = content.get(name)
    return record if isinstance(record, ConfigRecord) else None


def metric_records(content: RecordDict) -> dict[str, MetricRecord]:
    """The metric records of ``content`` by name, as a plain dict: ``content.metric_records``
    builds Flower's type-checked dict of them (35 us), several times for every reply a server
    screens and counts."""
    return {name: r for name, r in content.items() if isinstance(r, MetricRecord)}


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


def from_record(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def to_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """Named arrays as one ``.npz`` blob: a second set of weights inside a ConfigRecord (Flower's
    strategies build train messages of one ArrayRecord and one ConfigRecord)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def from_bytes(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
