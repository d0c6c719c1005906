"""A FedAvg reply is checked against the model sent: the attacks below pass ``finite_arrays``
alone (a weight of NaN, 1e12 or < 0; an array broadcast by ``+=``; a key missing or added) and
would each move the average; each is rejected, counted as malformed."""

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedsim.validators import MAX_EXAMPLES, finite_arrays, finite_metrics, model_reply

SENT = ArrayRecord({"w": Array(np.zeros((3, 2), np.float32)), "b": Array(np.zeros(2, np.float32))})


def _reply(arrays: dict, examples=10) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                       "metrics": MetricRecord({"num-examples": examples})})


GOOD = {"w": np.ones((3, 2), np.float32), "b": np.ones(2, np.float32)}


@pytest.mark.parametrize("examples", [float("nan"), 1e12, -5, 0, 2.5])
def test_an_implausible_weight_is_rejected(examples):
    assert model_reply(SENT)(_reply(GOOD, examples))
    assert finite_arrays(_reply(GOOD, examples))


@pytest.mark.parametrize("arrays", [
    {"w": np.ones((1, 2), np.float32), "b": np.ones(2, np.float32)},    # broadcast into (3, 2)
    {"w": np.ones((3, 2), np.float64), "b": np.ones(2, np.float32)},    # another dtype
    {"w": np.ones((3, 2), np.float32)},                                 # a key missing
    {**GOOD, "extra": np.ones(1, np.float32)},                          # a key added
    {"w": np.full((3, 2), np.nan, np.float32), "b": np.ones(2, np.float32)},
])
def test_arrays_unlike_the_model_sent_are_rejected(arrays):
    assert model_reply(SENT)(_reply(arrays))


def test_a_reply_like_the_model_sent_is_accepted():
    assert model_reply(SENT)(_reply(GOOD)) is None
    assert model_reply(SENT)(_reply(GOOD, MAX_EXAMPLES)) is None


def test_an_evaluation_reply_needs_every_metric_finite():
    check = finite_metrics(["bleu1", "trust"])
    assert check(RecordDict({"m": MetricRecord({"bleu1": 3.0, "trust": 1, "extra": float("nan")})})) is None
    assert "missing" in check(RecordDict({"m": MetricRecord({"bleu1": 3.0})}))
    assert "finite" in check(RecordDict({"m": MetricRecord({"bleu1": float("nan"), "trust": 0.5})}))
    assert "finite" in check(RecordDict({"m": MetricRecord({"bleu1": [1.0, 2.0], "trust": 0.5})}))
    assert "one MetricRecord" in check(RecordDict({}))
