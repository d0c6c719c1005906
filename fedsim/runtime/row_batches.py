"""Columnar batch replies (``hardware.client_backend: batched``): a SuperNode's hosted clients'
replies as rows of one matrix per array and metric, not one record per client.

Under the ``messages`` backend (``fedsim/runtime/sharded_grid.py``'s :func:`pack`) a SuperNode
answering for N logical clients sends N sets of records, each array serialized on its own, and
the server rebuilds them one by one. Here the replies of the clients whose records have the same
names, keys, dtypes and shapes (a *group*: normally every client of the batch) are stacked: each
array key becomes one ``(members, *shape)`` array and each scalar metric one vector, so the reply
holds O(groups) records whatever N is. A reply that does not stack (a config record, a list
metric, an array of another shape, say one a faulty client sent) travels as :func:`pack` sends
it, beside the groups: it is still that client's own reply.

A handler class that can compute its clients' train replies as columns (``train_rows``,
``fedsim_clients/handler.py``; FedTP's topic preferences, turn sentiment's epochs) gives the group without a client
object or reply per client (:func:`columns`, the same bytes), where every layer a client's
message passes (faults, client-side clipping, SecAgg+, HE) would pass it unchanged
(``fedsim/runtime/client_app.py``'s ``_rows_reply``).

On the server, :func:`split_rows` gives each client its reply back, exactly what the client's
handler returned (same bytes of every array: a row's serialization is the stacked array's
header for one row and the row's own bytes), so every per-client check, clipping and strategy
sees what the ``messages`` backend gives it. A group whose stacked array does not decode or has
not one row per member makes each of its members a ``malformed`` reply, no other client's.

Hand-written, not Flower's: Flower carries records, not tables; its serialization is per array.
"""

from __future__ import annotations

import io
import struct

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

ROWS = "fedsim-rows"  # the manifest's ArrayRecord name prefix of a group's record
GROUPS = "groups"  # manifest: per group, its members (indices) and record kinds/keys
ARRAY, METRIC = "arrays", "metrics"


def _raw(array: Array) -> bytes | None:
    """The array's bytes without numpy's header, where it is a C-ordered ``numpy.ndarray``
    serialization of exactly its shape and dtype (None: not stacked, sent as it is)."""
    data = array.data
    if array.stype != "numpy.ndarray" or data[:6] != b"\x93NUMPY" or len(data) < 10:
        return None
    start = 10 + struct.unpack("<H", data[8:10])[0] if data[6] == 1 else None
    if start is None or b"'fortran_order': False" not in data[10:start]:
        return None
    size = int(np.prod(array.shape, dtype=np.int64)) * np.dtype(array.dtype).itemsize
    return data[start:] if len(data) - start == size else None


def header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """numpy's ``.npy`` header of a C-ordered array (what ``np.save`` writes before the bytes)."""
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer,
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
            "fortran_order": False,
            "shape": shape,
        },
    )
    return buffer.getvalue()


def _metric_kind(value) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return "int64"
    return "float64" if isinstance(value, float) else None


def signature(content: RecordDict):
    """What must match for replies to stack (None: this one does not): record names, kinds,
    keys, array dtypes and shapes, metric types."""
    if not content or content.config_records:
        return None
    sig = []
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            keys = tuple((k, a.dtype, tuple(a.shape)) for k, a in record.items())
            if any(_raw(a) is None for a in record.values()):
                return None
            sig.append((name, ARRAY, keys))
        else:
            kinds = tuple((k, _metric_kind(v)) for k, v in record.items())
            if any(kind is None for _, kind in kinds):
                return None
            sig.append((name, METRIC, kinds))
    return tuple(sig)


def stack(contents: list[RecordDict]) -> tuple[RecordDict, list[int], list[dict]]:
    """The stackable replies as groups: the records of each (``<ROWS>/<group>/<record>``), the
    indices of the replies left to :func:`pack`, and each group's manifest entry."""
    groups: dict[tuple, list[int]] = {}
    single = []
    for i, content in enumerate(contents):
        sig = signature(content)
        if sig is None:
            single.append(i)
        else:
            groups.setdefault(sig, []).append(i)
    packed, manifest = RecordDict(), []
    for g, (sig, members) in enumerate(groups.items()):
        records = []
        for name, kind, keys in sig:
            stacked = {}
            for key, *meta in keys:
                column = [contents[i][name][key] for i in members]
                stacked[key] = _stacked_array(column, kind, meta)
            packed[f"{ROWS}/{g}/{name}"] = ArrayRecord(stacked)
            records.append([name, kind, [key for key, *_ in keys]])
        manifest.append({"members": members, "records": records})
    return packed, single, manifest


def columns(records: list[tuple[str, str, dict[str, np.ndarray]]], count: int):
    """What :func:`stack` gives for ``count`` replies that stack as one group, built from their
    columns (a handler's ``train_rows``: each record's name, kind and, per key, the matrix or
    metric vector of one row per client) without a reply object per client: the group's
    records and its manifest entry. The same bytes as :func:`stack` of the replies."""
    packed, names = RecordDict(), []
    for name, kind, arrays in records:
        if any(len(a) != count for a in arrays.values()):
            raise ValueError(f"record {name!r}: not {count} rows in every column")
        packed[f"{ROWS}/0/{name}"] = ArrayRecord(
            {key: _column_array(np.asarray(a), kind) for key, a in arrays.items()}
        )
        names.append([name, kind, list(arrays)])
    return packed, {"members": list(range(count)), "records": names}


def _column_array(matrix: np.ndarray, kind: str) -> Array:
    if kind == METRIC:
        return Array(matrix)
    dtype, shape = str(matrix.dtype), tuple(matrix.shape)
    rows = memoryview(np.ascontiguousarray(matrix)).cast("B")  # one copy: the Array's bytes
    data = b"".join((header(dtype, shape), rows))
    return Array(dtype=dtype, shape=shape, stype="numpy.ndarray", data=data)


def _stacked_array(column: list, kind: str, meta: list) -> Array:
    if kind == METRIC:
        return Array(np.asarray(column, dtype=meta[0]))
    dtype, shape = meta
    shape = (len(column), *shape)
    data = header(dtype, shape) + b"".join(_raw(a) for a in column)
    return Array(dtype=dtype, shape=shape, stype="numpy.ndarray", data=data)


def split_rows(content: RecordDict, manifest: list) -> dict[int, RecordDict | str]:
    """Each stacked member's reply (by its index in the batch), or why its group is unreadable."""
    parts: dict[int, RecordDict | str] = {}
    for g, entry in enumerate(manifest):
        try:
            members = [int(i) for i in entry["members"]]
        except Exception:  # noqa: BLE001 - members unknown: theirs are read as unstacked parts
            continue
        try:
            rows = _group_rows(content, g, entry["records"], len(members))
        except Exception as exc:  # noqa: BLE001 - whatever the SuperNode sent
            why = f"row group {g} of the batch is unreadable: {type(exc).__name__}: {exc!s:.120}"
            parts.update((i, why) for i in members)
            continue
        parts.update(zip(members, rows))
    return parts


def _group_rows(content: RecordDict, g: int, records: list, count: int) -> list[RecordDict]:
    rows = [RecordDict() for _ in range(count)]
    for name, kind, keys in records:
        record = content[f"{ROWS}/{g}/{name}"]
        if list(record.keys()) != list(keys):
            raise ValueError(f"record {name!r} holds {list(record.keys())}, manifest {keys}")
        columns = {}
        for key in keys:
            matrix = record[key].numpy()
            if matrix.ndim < 1 or matrix.shape[0] != count:
                raise ValueError(f"{name}/{key}: {matrix.shape[0]} rows for {count} clients")
            columns[key] = _cells(matrix, kind)
        for i, row in enumerate(rows):
            cells = {key: column[i] for key, column in columns.items()}
            row[name] = ArrayRecord(cells) if kind == ARRAY else MetricRecord(cells)
    return rows


def _cells(matrix: np.ndarray, kind: str) -> list:
    """One entry per row: a metric's Python number, or an Array serialized as ``np.save`` would
    serialize the row on its own (its header once, then each row's bytes)."""
    if kind == METRIC:
        if matrix.ndim != 1 or matrix.dtype.kind not in "if":
            raise ValueError(f"metric column of shape {matrix.shape}, dtype {matrix.dtype}")
        return matrix.tolist()
    if kind != ARRAY:
        raise ValueError(f"unknown record kind {kind!r}")
    matrix = np.ascontiguousarray(matrix)
    dtype, shape = str(matrix.dtype), tuple(matrix.shape[1:])
    head = header(dtype, shape)
    return [
        Array(dtype=dtype, shape=shape, stype="numpy.ndarray", data=head + row.tobytes())
        for row in matrix
    ]
