"""A FedAvg reply is checked against the model sent and what its node declared: the attacks below
pass a check of finite arrays alone (a weight of NaN, 1e12, above the node's declaration or
< 0; an array broadcast by ``+=``; a key missing or added; a string dtype) and would each move
the average or stop it; each is rejected, counted as malformed."""

import struct

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedsim.runtime.validators import (
    Arrays,
    Config,
    Metrics,
    Number,
    Numbers,
    Reply,
    Text,
    finite_arrays,
    metric_values,
    model_reply,
    npy_view,
    weight,
)

SENT = ArrayRecord({"w": Array(np.zeros((3, 2), np.float32)), "b": Array(np.zeros(2, np.float32))})
DECLARED = {1: 50, 2: 10}  # node -> the examples it declared at discovery
REPLY = model_reply(SENT, Metrics({"num-examples": weight(DECLARED.get)}))


def _reply(arrays: dict, examples=10) -> RecordDict:
    return RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": examples}),
        }
    )


GOOD = {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)}


@pytest.mark.parametrize("examples", [float("nan"), 1e12, 51, -5, 0, 2.5, [10, 10]])
def test_an_implausible_weight_is_rejected(examples):
    assert REPLY(_reply(GOOD, examples), 1)


def test_the_weight_is_bounded_by_what_the_node_declared():
    assert REPLY(_reply(GOOD, 50), 1) is None
    assert "outside [1, 10]" in REPLY(_reply(GOOD, 50), 2)


@pytest.mark.parametrize(
    "arrays",
    [
        {"w": np.ones((1, 2), np.float32), "b": np.ones(2, np.float32)},  # broadcast into (3, 2)
        {"w": np.ones((3, 2), np.float64), "b": np.ones(2, np.float32)},  # another dtype
        {"w": np.ones((3, 2), np.float32)},  # a key missing
        {**GOOD, "extra": np.ones(1, np.float32)},  # a key added
        {"w": np.full((3, 2), np.nan, np.float32), "b": np.ones(2, np.float32)},
        {"w": np.full((3, 2), "x"), "b": np.ones(2, np.float32)},  # a string dtype
    ],
)
def test_arrays_unlike_the_model_sent_are_rejected(arrays):
    assert REPLY(_reply(arrays), 1)


def test_a_reply_like_the_model_sent_is_accepted():
    assert REPLY(_reply(GOOD), 1) is None
    assert finite_arrays(_reply(GOOD), 1) is None
    assert "not numeric" in finite_arrays(_reply({"w": np.full(2, "x")}), 1)


def test_records_are_exactly_the_declared_ones():
    assert "records missing" in REPLY(RecordDict({"arrays": _reply(GOOD)["arrays"]}), 1)
    extra = _reply(GOOD)
    extra["more"] = MetricRecord({"x": 1.0})
    assert "unexpected records" in REPLY(extra, 1)
    swapped = RecordDict(
        {"arrays": _reply(GOOD)["arrays"], "metrics": ConfigRecord({"num-examples": 10})}
    )
    assert "not a metric record" in REPLY(swapped, 1)


def test_declared_keys_are_required_and_typed_others_are_informational_numbers():
    schema = Reply(
        {"m": Metrics({"loss": Number()}, {"alpha": Number(0.0, 1.0)}, {"turn/": Numbers()})}
    )
    every = MetricRecord({"loss": 1.0, "alpha": 0.5, "turn/x": [1, 2], "seconds": 3.0})
    assert schema(RecordDict({"m": every}), 1) is None
    assert "missing" in schema(RecordDict({"m": MetricRecord({"alpha": 0.5})}), 1)
    assert "outside" in schema(RecordDict({"m": MetricRecord({"loss": 1.0, "alpha": 2.0})}), 1)
    assert "list where a number" in schema(RecordDict({"m": MetricRecord({"loss": [1.0]})}), 1)
    assert "where a list is expected" in schema(
        RecordDict({"m": MetricRecord({"loss": 1.0, "turn/x": 1})}), 1
    )
    assert "list where a number" in schema(
        RecordDict({"m": MetricRecord({"loss": 1.0, "seconds": [3.0]})}), 1
    )
    info = Reply({"i": Config({"population": Text(choices=("majority", "minority"))})})
    assert "unexpected key" in info(
        RecordDict({"i": ConfigRecord({"population": "majority", "x": 1})}), 1
    )
    assert "not one of" in info(RecordDict({"i": ConfigRecord({"population": "everyone"})}), 1)


def test_every_metric_must_be_finite():
    assert metric_values(RecordDict({"m": MetricRecord({"loss": 1.0, "turn/x": [1, 2]})})) is None
    assert "not finite" in metric_values(RecordDict({"m": MetricRecord({"loss": float("nan")})}))
    assert "not finite" in metric_values(
        RecordDict({"m": MetricRecord({"turn/x": [1.0, float("inf")]})})
    )


@pytest.mark.parametrize(
    "declared", [{"shape": (7,)}, {"shape": ("uninflatable",)}, {"dtype": "int64"}]
)
def test_an_array_is_read_by_what_it_holds_and_refused_where_it_declares_otherwise(declared):
    record = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    for name, value in declared.items():
        setattr(record["w"], name, value)  # Flower keeps the sender's metadata as sent
    assert "declares" in Arrays().problem(record, 1)


@pytest.mark.parametrize(
    "values",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        np.arange(5, dtype=">i4"),
        np.array(7, dtype=np.uint32),
        np.zeros((0, 3), np.float32),
    ],
)
def test_a_view_of_an_array_holds_what_flower_decodes(values):
    array = Array(values)
    view = npy_view(array)
    assert view.dtype == array.numpy().dtype and np.array_equal(view, array.numpy())
    assert not view.flags.writeable  # the reply's bytes: nothing may change them


def test_a_buffer_shorter_than_its_header_says_is_refused():
    array = Array(np.arange(100, dtype=np.float32))
    array.data = array.data[:-4]
    with pytest.raises(ValueError):
        npy_view(array)
    assert "undecodable" in Arrays().problem(ArrayRecord({"w": array}), 1)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda data: data[:9],  # cut inside the header's length
        lambda data: data[:20],  # cut inside the header
        lambda data: data[:8] + struct.pack("<H", 200) + data[10:],  # a length past the header
        lambda data: data[:8] + struct.pack("<H", 20) + data[10:],  # a length inside it
        lambda data: data[:6] + bytes([3, 0]) + data[8:],  # a version numpy never wrote
        lambda data: b"\x93NUMPY\x02\x00" + struct.pack("<I", 10**6) + bytes(10**6 + 64),
    ],
)
def test_a_header_that_lies_about_itself_is_refused(tamper):
    """Each distinct header is read once (a cache by its bytes): a header the cache never saw,
    or one whose length field lies, is read by numpy or refused, never taken from another's."""
    array = Array(np.arange(100, dtype=np.float32))
    npy_view(array)  # its true header read and cached
    array.data = tamper(array.data)
    assert "undecodable" in Arrays().problem(ArrayRecord({"w": array}), 1)


def test_an_object_array_is_refused_without_unpickling():
    array = Array(np.zeros(2, np.float32))
    array.data = array.data.replace(b"'<f4'", b"'|O' ")
    assert Arrays().problem(ArrayRecord({"w": array}), 1) is not None
