"""How SecAgg+ messages carry their lists: one ``bytes`` value each, not a ConfigRecord list.

A SecAgg (every client a neighbour) round of ``n`` clients moves about ``16 n^2`` list items
(ids, public keys, ciphertexts, share hashes, shares, signatures). Flower types, serializes and
rebuilds a ConfigRecord list item by item in Python, and the messaging path screens and
measures each: at 100 clients that was most of the server's time per round
(``bench/secagg_cost.py``). Packed, a list is one value, checked once by its length, and
unpacked where it is used. An unpacking that does not add up raises :class:`ValueError`, which
the server's reply checks turn into the reply's reason for being malformed and a client into a
refusal.
"""

from __future__ import annotations

import numpy as np

_ID = np.dtype("<u8")  # a node id: Flower's are unsigned 64-bit
_LENGTH = np.dtype(">u4")


def ids(nodes) -> bytes:
    """Node ids as little-endian uint64, in their order."""
    return np.asarray(list(nodes), dtype=_ID).tobytes()


def unpack_ids(data: bytes) -> list[int]:
    """The ids :func:`ids` packed."""
    if not isinstance(data, bytes) or len(data) % _ID.itemsize:
        raise ValueError("node ids are not a whole number of uint64")
    return np.frombuffer(data, dtype=_ID).tolist()


def blobs(items) -> bytes:
    """``bytes`` items: their count and lengths (uint32, big-endian), then the items."""
    items = list(items)
    head = np.asarray([len(items), *(len(b) for b in items)], dtype=_LENGTH).tobytes()
    return head + b"".join(items)


def unpack_blobs(data: bytes, limit: int = 1 << 20) -> list[bytes]:
    """The items :func:`blobs` packed; each at most ``limit`` bytes."""
    if not isinstance(data, bytes) or len(data) < 4:
        raise ValueError("packed items are not bytes with a count")
    count = int.from_bytes(data[:4], "big")
    if 4 * (count + 1) > len(data):
        raise ValueError(f"{count} packed items' lengths are cut off")
    sizes = np.frombuffer(data, dtype=_LENGTH, count=count, offset=4).astype(np.int64)
    if count and int(sizes.max()) > limit:
        raise ValueError(f"a packed item of {int(sizes.max())} bytes, above {limit}")
    ends = np.cumsum(sizes) + 4 * (count + 1)
    if (int(ends[-1]) if count else 4) != len(data):
        raise ValueError("the packed items' lengths do not add up to the data")
    ends = ends.tolist()
    return [data[a:b] for a, b in zip([4 * (count + 1), *ends[:-1]], ends)]
