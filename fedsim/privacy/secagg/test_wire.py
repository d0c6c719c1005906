"""SecAgg+'s packed lists: what is packed comes back, and data whose lengths do not add up is
refused (a malformed reply, not a crash or a silently shorter list)."""

import pytest

from fedsim.privacy.secagg import wire


def test_packed_lists_come_back():
    items = [b"", b"a", bytes(range(256)) * 3, b"\x00" * 70]
    assert wire.unpack_blobs(wire.blobs(items)) == items
    assert wire.unpack_blobs(wire.blobs([])) == []
    ids = [1, 2**63 + 5, 2**64 - 1]  # Flower's node ids are unsigned 64-bit
    assert wire.unpack_ids(wire.ids(ids)) == ids


@pytest.mark.parametrize(
    "data, why",
    [
        (b"", "with a count"),
        (b"\x00\x00\x00\x02\x00\x00\x00\x01", "cut off"),
        (wire.blobs([b"abc", b"de"])[:-1], "do not add up"),
        (wire.blobs([b"abc", b"de"]) + b"x", "do not add up"),
        (wire.blobs([b"x" * 100]), "above 99"),
        ([b"abc"], "not bytes"),
    ],
)
def test_packed_items_that_do_not_add_up_are_refused(data, why):
    with pytest.raises(ValueError, match=why):
        wire.unpack_blobs(data, limit=99)


def test_ids_that_are_not_whole_uint64_are_refused():
    with pytest.raises(ValueError, match="whole number of uint64"):
        wire.unpack_ids(wire.ids([1, 2])[:-1])
