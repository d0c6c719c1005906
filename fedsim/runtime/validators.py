"""What a reply must be, checked in full in the Messenger's screen (``fedsim/runtime/messaging.py``) before
any strategy or protocol code reads it.

A phase declares its reply once, as a :class:`Reply`: which records (by name and kind), which keys
each holds and of what type (a finite number in bounds, a list of them, text, bytes), which arrays
(numeric, finite, the keys, shapes and dtypes of the model sent), then any check across them. A
bound may be one number or a function of the sending node: what that node declared at discovery
(its partition's examples, the conversations it hosts), so that no reply weighs more than its node
holds. A reply that fails is left out and counted ``malformed``; so is one whose check raises.

Every reply, whatever its phase, also passes :func:`metric_values`: a metric is a finite number or a
list of finite numbers (one NaN train loss would make a round's reported loss NaN).

Metric keys a phase does not declare are informational (timings, a trainer's statistics): finite
numbers that nothing but reports reads. Flower's strategies refuse replies whose metric keys differ,
so the exchanges Flower aggregates keep only the informational keys every reply carries
(:func:`common_metrics`); everything a strategy or protocol reads is declared, and required.
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedsim.flower.messages import SType
from fedsim.message_keys import ARRAYS, INFO, METRICS, PARTITION_ID
from fedsim.runtime.records import metric_records

Validator = Callable[
    [RecordDict, int], "str | None"
]  # (reply, its node) -> why it is malformed, or None
Bound = float | Callable[[int], float]  # a limit, or each node's (what it declared at discovery)


def at(bound: Bound, node: int) -> float:
    """The limit ``bound`` sets for ``node``."""
    return float(bound(node)) if callable(bound) else float(bound)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Number:
    """A finite int or float in [low, high] (whole: an integral value)."""

    low: Bound = -math.inf
    high: Bound = math.inf
    whole: bool = False

    def problem(self, value, node: int) -> str | None:
        if not _is_number(value):
            return f"{type(value).__name__} where a number is expected"
        if not math.isfinite(value):
            return f"{value} is not finite"
        if self.whole and value != int(value):
            return f"{value} is not a whole number"
        low, high = at(self.low, node), at(self.high, node)
        return None if low <= value <= high else f"{value:g} outside [{low:g}, {high:g}]"


@dataclass(frozen=True)
class Numbers:
    """A list of at most ``length`` numbers, each an ``item``."""

    item: Number = Number()
    length: Bound = math.inf

    def problem(self, value, node: int) -> str | None:
        if not isinstance(value, list):
            return f"{type(value).__name__} where a list is expected"
        if len(value) > at(self.length, node):
            return f"{len(value)} values, at most {at(self.length, node):g}"
        return next(
            (
                f"item {i}: {why}"
                for i, v in enumerate(value)
                if (why := self.item.problem(v, node))
            ),
            None,
        )


@dataclass(frozen=True)
class Text:
    """A str of at most ``length`` characters, one of ``choices`` where given."""

    length: int = 1000
    choices: tuple[str, ...] | None = None

    def problem(self, value, node: int) -> str | None:
        if not isinstance(value, str) or len(value) > self.length:
            return f"not a str of at most {self.length} characters"
        return (
            None
            if self.choices is None or value in self.choices
            else f"{value!r:.40} not one of {self.choices}"
        )


@dataclass(frozen=True)
class Texts:
    """A list of at most ``length`` str, each a ``item``."""

    item: Text = Text()
    length: Bound = math.inf

    def problem(self, value, node: int) -> str | None:
        if not isinstance(value, list) or len(value) > at(self.length, node):
            return "not a list of the expected length"
        return next(
            (
                f"item {i}: {why}"
                for i, v in enumerate(value)
                if (why := self.item.problem(v, node))
            ),
            None,
        )


@dataclass(frozen=True)
class Blob:
    """``bytes`` of at most ``length``."""

    length: int = 1 << 30

    def problem(self, value, node: int) -> str | None:
        return (
            None
            if isinstance(value, bytes) and len(value) <= self.length
            else "not bytes of a plausible size"
        )


@dataclass(frozen=True)
class Blobs(Texts):
    """A list of at most ``length`` ``bytes``, each a ``item``."""

    item: Blob = Blob()


Field = Number | Numbers | Text | Texts | Blob | Blobs


@dataclass(frozen=True)
class Keys:
    """A record of keys: ``required`` ones, ``optional`` ones, families of keys by ``prefixes``;
    any other key an informational finite number where ``informational``, else refused."""

    required: Mapping[str, Field] = field(default_factory=dict)
    optional: Mapping[str, Field] = field(default_factory=dict)
    prefixes: Mapping[str, Field] = field(default_factory=dict)
    informational: bool = True

    def field_of(self, key: str) -> Field | None:
        if key in self.required or key in self.optional:
            return self.required[key] if key in self.required else self.optional[key]
        prefix = next((p for p in self.prefixes if key.startswith(p)), None)
        if prefix is not None:
            return self.prefixes[prefix]
        return Number() if self.informational else None

    def problem(self, record, node: int) -> str | None:
        missing = [k for k in self.required if k not in record]
        if missing:
            return f"keys missing: {missing[:3]}"
        for key, value in record.items():
            spec = self.field_of(key)
            if spec is None:
                return f"unexpected key {key!r:.60}"
            if why := spec.problem(value, node):
                return f"{key!r:.60}: {why}"
        return None


@dataclass(frozen=True)
class Metrics(Keys):
    """A MetricRecord."""

    kind = MetricRecord


@dataclass(frozen=True)
class Config(Keys):
    """A ConfigRecord (no informational keys)."""

    informational: bool = False
    kind = ConfigRecord


@dataclass(frozen=True)
class Arrays:
    """An ArrayRecord of decodable, numeric, finite arrays: exactly the keys, shapes and dtypes of
    ``like`` (the model sent: an array of another shape would be broadcast into the average by
    ``+=``; a missing key would silently keep the old weights), else any non-empty set."""

    like: ArrayRecord | None = None
    kind = ArrayRecord

    def problem(self, record: ArrayRecord, node: int) -> str | None:
        if not len(record):
            return "no arrays"
        if self.like is not None and set(record) != set(self.like):
            missing, extra = (
                sorted(set(self.like) - set(record)),
                sorted(set(record) - set(self.like)),
            )
            return (
                f"arrays differ from the model sent: missing {missing[:3]}, extra {extra[:3]!r:.80}"
            )
        for name, array in record.items():
            if why := array_problem(name, array, None if self.like is None else self.like[name]):
                return why
        return None


NPY_HEADER_LIMIT = 10_000  # numpy's own default (read_array_header's max_header_size)
_NPY_HEADERS = {
    (1, 0): (np.lib.format.read_array_header_1_0, "<H"),
    (2, 0): (np.lib.format.read_array_header_2_0, "<I"),
}


def npy_view(array) -> np.ndarray:
    """A Flower ``Array``'s values as a read-only view of its ``.npy`` bytes. Hand-written because
    ``Array.numpy()`` (``np.load``) copies them: a server that keeps every reply's copy until it
    sums them (SecAgg+'s masked vectors, 100 of 400 kB a round) faults in fresh memory for each,
    0.9 ms an array here against 0.03 ms a view. Header parsing is numpy's (its size limit and
    literal-only reading), once per distinct header (:func:`_npy_header`); no pickle; a buffer
    shorter than its header says is refused."""
    if array.stype != SType.NUMPY:
        raise TypeError(f"serialization {array.stype!r:.40}, not {SType.NUMPY}")
    data = array.data
    version = tuple(data[6:8])
    if data[:6] != b"\x93NUMPY" or version not in _NPY_HEADERS:
        raise ValueError(f"not a .npy buffer of a version read (1.0, 2.0): {data[:8]!r:.40}")
    size_format = _NPY_HEADERS[version][1]
    start = 8 + struct.calcsize(size_format)
    end = start + struct.unpack(size_format, data[8:start])[0]
    if end - start > NPY_HEADER_LIMIT:
        raise ValueError(
            f"a .npy header of {end - start} bytes (numpy reads at most {NPY_HEADER_LIMIT})"
        )
    shape, fortran, dtype = _npy_header(bytes(data[:end]))
    values = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=end)
    return values.reshape(shape, order="F" if fortran else "C")


@lru_cache(maxsize=256)
def _npy_header(header: bytes) -> tuple[tuple[int, ...], bool, np.dtype]:
    """numpy's reading of one ``.npy`` header (shape, Fortran order, dtype): every reply of a
    round carries the same few headers, and numpy reads each with ``ast.literal_eval`` (50 us)."""
    stream = io.BytesIO(header)
    version = np.lib.format.read_magic(stream)
    shape, fortran, dtype = _NPY_HEADERS[version][0](stream)
    if stream.tell() != len(header):
        raise ValueError("the .npy header is not where its length says")
    return shape, fortran, dtype


def decoded(name: str, array) -> np.ndarray | str:
    """The array (a read-only view: :func:`npy_view`), or why it is unusable: undecodable, or not
    numbers (a string dtype has no NaN to look for and no mean)."""
    try:
        values = npy_view(array)
    except Exception as exc:  # noqa: BLE001 - any undecodable payload
        return f"undecodable array {name!r:.60}: {type(exc).__name__}"
    if list(array.shape) != list(values.shape) or str(array.dtype) != str(
        values.dtype
    ):  # the sender's words
        return (
            f"{name!r:.60} declares {array.dtype!s:.20}{list(array.shape)!s:.40}, "
            f"holds {values.dtype}{list(values.shape)}"
        )
    if values.dtype.kind not in "fiu":
        return f"{name!r:.60}: dtype {values.dtype} is not numeric"
    return values


def array_problem(name: str, array, like=None) -> str | None:
    values = decoded(name, array)
    if isinstance(values, str):
        return values
    if like is not None and (
        values.shape != tuple(like.shape) or values.dtype != np.dtype(like.dtype)
    ):
        return f"{name}: {values.dtype}{values.shape}, sent {like.dtype}{tuple(like.shape)}"
    if not np.all(np.isfinite(values)):
        return f"non-finite values (NaN/Inf) in {name}"
    return None


Record = Metrics | Config | Arrays


@dataclass(frozen=True)
class Reply:
    """One phase's reply: exactly the ``records`` (name -> kind and content; ``optional`` names may
    be absent), then ``check`` across them (rows within the node's bound, lists of equal
    length, ...)."""

    records: Mapping[str, Record]
    optional: frozenset[str] = frozenset()
    check: Validator | None = None

    def __call__(self, content: RecordDict, node: int) -> str | None:
        names = set(content.keys())
        if extra := names - set(self.records):
            return f"unexpected records {sorted(extra)[:3]!r:.80}"
        if missing := set(self.records) - names - self.optional:
            return f"records missing: {sorted(missing)}"
        for name, spec in self.records.items():
            if name not in names:
                continue
            if not isinstance(content[name], spec.kind):
                return f"record {name!r} is not a {spec.kind.__name__[:-6].lower()} record"
            if why := spec.problem(content[name], node):
                return f"{name}: {why}"
        return self.check(content, node) if self.check else None


def both(*validators: Validator | None) -> Validator | None:
    """A reply must pass every one of ``validators`` (None: no check), in order."""
    chosen = [v for v in validators if v is not None]
    if len(chosen) < 2:
        return chosen[0] if chosen else None
    return lambda content, node: next((why for v in chosen if (why := v(content, node))), None)


def metric_values(content: RecordDict) -> str | None:
    """Every reply's metrics: finite numbers, or lists of them."""
    for name, record in metric_records(content).items():
        for key, value in record.items():
            values = value if isinstance(value, list) else [value]
            if not all(_is_number(v) and math.isfinite(v) for v in values):
                return f"metric {name}/{key!r:.60} is not finite"
    return None


def common_metrics(replies: list[Message]) -> list[Message]:
    """``replies`` whose metric records keep only the keys every reply's record of that name
    carries: Flower's strategies raise on replies whose keys differ (``InconsistentMessageReplies``).
    Only informational keys can differ: what is read is required of every reply."""
    records = [metric_records(m.content) for m in replies]
    names = {name for r in records for name in r}
    for name in names:
        shared = set.intersection(*(set(r.get(name, {})) for r in records))
        for m, held in zip(replies, records):
            record = held.get(name)
            if record is not None and set(record) != shared:
                m.content[name] = MetricRecord({k: v for k, v in record.items() if k in shared})
    return replies


def weight(bound: Bound, low: float = 1) -> Number:
    """A FedAvg-style weight (examples, rows): a whole number in [low, bound] (NaN, 1e12 or a
    negative weight would let one reply set the model)."""
    return Number(low, bound, whole=True)


def model_reply(
    sent: ArrayRecord, metrics: Metrics, arrays: str = ARRAYS, metric: str = METRICS
) -> Reply:
    """A trained model's reply: ``arrays`` shaped as the model ``sent``, ``metrics`` as declared."""
    return Reply({arrays: Arrays(sent), metric: metrics})


def like_model(sent: ArrayRecord) -> Validator:
    """A strategy's own check, whatever its record names: one ArrayRecord shaped as the model
    ``sent`` (a protocol's :class:`Reply` checks the rest)."""
    shaped = Arrays(sent)

    def check(content: RecordDict, node: int) -> str | None:
        records = list(content.array_records.values())
        return "expected one ArrayRecord" if len(records) != 1 else shaped.problem(records[0], node)

    return check


def finite_arrays(content: RecordDict, node: int) -> str | None:
    """One non-empty ArrayRecord of finite numeric arrays (a strategy driven without a protocol's
    reply schema: tests, benches)."""
    records = list(content.array_records.values())
    if len(records) != 1:
        return "expected one non-empty ArrayRecord"
    return Arrays().problem(records[0], node)


def discovery_reply(
    partition_of: Callable[[int], int | None],
    partitions: int,
    fields: Mapping[str, Field],
    check: Callable[[ConfigRecord, int], str | None],
) -> Reply:
    """A discovery reply: its INFO names the node's partition, the one it told at ``whoami``
    (``partition_of``, the Messenger's map, where it asked; else a whole number below
    ``partitions``), and the method's ``fields``, which ``check(info, partition)`` holds against
    what the public partitioning gives that partition. Every method's discovery shares this, so
    a partition is checked against the Messenger's map in one place."""

    def checked(content: RecordDict, node: int) -> str | None:
        info, told = content[INFO], partition_of(node)
        if told is not None and info[PARTITION_ID] != told:
            return f"claims partition {info[PARTITION_ID]}, told {told} at whoami"
        return check(info, int(info[PARTITION_ID]))

    return Reply(
        {INFO: Config({PARTITION_ID: Number(0, partitions - 1, whole=True), **fields})},
        check=checked,
    )
