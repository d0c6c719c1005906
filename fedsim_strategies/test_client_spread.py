"""ClientSpread: hand-checked distances, and through Flower's FedAvg the aggregate is
unchanged while the round's train metrics gain the clients' spread; around the strategies that
consume the records they read (QFedAvg, Bulyan) too."""

import gc
from functools import partial

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import Bulyan, FedAvg, QFedAvg

from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.records import from_record
from fedsim_strategies.client_spread import ClientSpread, model_spread


def test_spread_on_hand_checked_vectors():
    # weights 3:1, start at the origin: mean (1, 0); distances 1 and 3; updates 0 and 4
    got = model_spread(
        [{"w": np.array([0.0, 0.0])}, {"w": np.array([4.0, 0.0])}], [3, 1], {"w": np.zeros(2)}
    )
    assert got == pytest.approx(
        {
            "client-distance": 2.0,
            "update-norm": 2.0,
            "mean-update-norm": 1.0,
            "relative-distance": 1.0,
        }
    )
    same = model_spread(
        [{"w": np.ones(2), "b": np.ones(1)}] * 2, [1, 5], {"w": np.zeros(2), "b": np.zeros(1)}
    )
    assert same["client-distance"] == 0.0 and same["update-norm"] == pytest.approx(
        3**0.5
    )  # over both arrays
    assert (
        model_spread([{"w": np.zeros(2)}], [1], {"w": np.zeros(2)})["relative-distance"] == 0.0
    )  # no update


class StepClient:
    """'Trains' by adding a fixed step to the weights it is sent."""

    def __init__(self, step, examples):
        self.step, self.examples = step, examples

    def __call__(self, msg):
        assert msg.metadata.message_type == MessageType.TRAIN
        w = msg.content["arrays"].to_numpy_ndarrays()[0]
        return RecordDict(
            {
                "arrays": ArrayRecord([w + self.step]),
                "metrics": MetricRecord(
                    {"num-examples": self.examples, "loss": float(self.step.sum())}
                ),
            }
        )


def test_fedavg_rounds_report_the_spread_and_keep_the_aggregate():
    steps = {1: np.array([1.0, 0.0]), 2: np.array([-1.0, 2.0])}
    grid = InProcessGrid({n: StepClient(s, 10) for n, s in steps.items()})
    strategy = ClientSpread(FedAvg(min_available_nodes=2, min_train_nodes=2, fraction_evaluate=0.0))
    result = strategy.start(
        grid, ArrayRecord([np.zeros(2)]), num_rounds=2, train_config=ConfigRecord({})
    )
    np.testing.assert_allclose(result.arrays.to_numpy_ndarrays()[0], [0.0, 2.0])  # 2 x mean step
    for r in (1, 2):  # the spread is measured from the round's own start: same each round
        m = result.train_metrics_clientapp[r]
        assert m["client-distance"] == pytest.approx(
            np.sqrt(2)
        )  # each step is (±1, ±1) off the mean
        assert m["update-norm"] == pytest.approx((1 + np.sqrt(5)) / 2)
        assert m["mean-update-norm"] == pytest.approx(1.0)
        assert m["loss"] == pytest.approx(1.0)  # FedAvg's own metrics stay (mean of 1 and 1)


@pytest.fixture
def frozen():
    """Both run ``gc.collect()`` per record they consume; in a session that imported torch each
    rescans ~0.7M objects (~0.5 s). Frozen, what was alive before the test is not rescanned."""
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.mark.parametrize(
    "inner",
    [partial(QFedAvg, client_learning_rate=0.1, train_loss_key="loss"), Bulyan],
    ids=["QFedAvg", "Bulyan"],
)
def test_strategies_that_consume_what_they_read_keep_their_aggregate(inner, frozen):
    """QFedAvg empties the weights it sent and the replies, Bulyan the replies, as they read them
    (``keep_input=False``): the spread comes from what was there before."""
    steps = {1: np.array([1.0, 0.0]), 2: np.array([-1.0, 2.0]), 3: np.array([0.0, 1.0])}

    def run(strategy):
        grid = InProcessGrid({n: StepClient(s, 10) for n, s in steps.items()})
        return strategy.start(
            grid, ArrayRecord([np.zeros(2)]), num_rounds=2, train_config=ConfigRecord({})
        )

    args = dict(min_available_nodes=3, min_train_nodes=3, fraction_evaluate=0.0)
    alone, wrapped = run(inner(**args)), run(ClientSpread(inner(**args)))
    np.testing.assert_array_equal(
        wrapped.arrays.to_numpy_ndarrays()[0], alone.arrays.to_numpy_ndarrays()[0]
    )
    assert wrapped.train_metrics_clientapp[1]["update-norm"] == pytest.approx((2 + np.sqrt(5)) / 3)


def _lora(b, a):
    return {
        "q.lora_A.weight": np.asarray(a, float),
        "q.lora_B.weight": np.asarray(b, float),
        "head.bias": np.zeros(2),
    }


def test_lora_pairs_are_also_measured_by_what_they_add():
    """A client whose adapters compute what the start's compute, re-factored (B R, R^-1 A, as an
    SVD re-factoring leaves them), has moved in factor space and not at all in what it adds."""
    rng = np.random.default_rng(0)
    b, a, r = rng.normal(size=(4, 2)), rng.normal(size=(2, 3)), np.array([[2.0, 1.0], [0.0, 0.5]])
    start, refactored = _lora(b, a), _lora(b @ r, np.linalg.inv(r) @ a)
    got = model_spread([refactored, start], [1, 1], start)
    assert got["update-norm"] > 1.0
    assert got["delta-update-norm"] == pytest.approx(0.0, abs=1e-12)
    assert got["delta-client-distance"] == pytest.approx(0.0, abs=1e-12)
    moved = _lora(b, a + 1.0)  # what it adds moves by B @ ones
    assert model_spread([moved], [1], start)["delta-update-norm"] == pytest.approx(
        np.linalg.norm(b @ np.ones((2, 3)))
    )
    # both add B @ A, yet averaging their factors apart does not give it back
    assert got["delta-factor-average-gap"] > 0.05
    assert model_spread([start, start], [1, 3], start)["delta-factor-average-gap"] == pytest.approx(
        0.0, abs=1e-12
    )
    two = [_lora([[1.0], [0.0]], [[1.0, 0.0]]), _lora([[0.0], [1.0]], [[0.0, 1.0]])]
    # mean(B @ A) = I/2; mean(B) @ mean(A) = ones/4: gap ||[[1,-1],[-1,1]]/4|| / ||I/2|| = 0.5 / 0.707
    zero = _lora([[0.0], [0.0]], [[0.0, 0.0]])
    assert model_spread(two, [1, 1], zero)["delta-factor-average-gap"] == pytest.approx(2**-0.5)
    assert "delta-update-norm" not in model_spread([{"w": np.ones(2)}], [1], {"w": np.zeros(2)})


class Refactoring:
    """Returns the adapters it is sent re-factored by ``r``: the same model."""

    def __init__(self, r):
        self.r = r

    def __call__(self, msg):
        w = from_record(msg.content["arrays"])
        b, a = w["q.lora_B.weight"], w["q.lora_A.weight"]
        return RecordDict(
            {
                "arrays": ArrayRecord(
                    {
                        **{k: Array(v) for k, v in w.items()},
                        "q.lora_B.weight": Array(b @ self.r),
                        "q.lora_A.weight": Array(np.linalg.inv(self.r) @ a),
                    }
                ),
                "metrics": MetricRecord({"num-examples": 10}),
            }
        )


def test_the_round_metrics_carry_the_adapters_distances():
    rng = np.random.default_rng(1)
    grid = InProcessGrid({1: Refactoring(np.diag([2.0, 0.5])), 2: Refactoring(np.eye(2))})
    start = _lora(rng.normal(size=(4, 2)), rng.normal(size=(2, 3)))
    strategy = ClientSpread(FedAvg(min_available_nodes=2, min_train_nodes=2, fraction_evaluate=0.0))
    result = strategy.start(
        grid,
        ArrayRecord({k: Array(v) for k, v in start.items()}),
        num_rounds=1,
        train_config=ConfigRecord({}),
    )
    m = result.train_metrics_clientapp[1]
    assert m["update-norm"] > 0.1 and m["delta-update-norm"] == pytest.approx(0.0, abs=1e-9)
