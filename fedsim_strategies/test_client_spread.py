"""ClientSpread: hand-checked distances, and through Flower's FedAvg the aggregate is
unchanged while the round's train metrics gain the clients' spread; around the strategies that
consume the records they read (QFedAvg, Bulyan) too."""

import gc
from functools import partial

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import Bulyan, FedAvg, QFedAvg

from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim_strategies.client_spread import ClientSpread, spread


def test_spread_on_hand_checked_vectors():
    # weights 3:1, start at the origin: mean (1, 0); distances 1 and 3; updates 0 and 4
    got = spread([np.array([0.0, 0.0]), np.array([4.0, 0.0])], [3, 1], np.zeros(2))
    assert got == pytest.approx({"client-distance": 2.0, "update-norm": 2.0,
                                 "mean-update-norm": 1.0, "relative-distance": 1.0})
    same = spread([np.ones(3), np.ones(3)], [1, 5], np.zeros(3))
    assert same["client-distance"] == 0.0 and same["update-norm"] == pytest.approx(3 ** 0.5)
    assert spread([np.zeros(2)], [1], np.zeros(2))["relative-distance"] == 0.0  # no update


class StepClient:
    """'Trains' by adding a fixed step to the weights it is sent."""

    def __init__(self, step, examples):
        self.step, self.examples = step, examples

    def __call__(self, msg):
        assert msg.metadata.message_type == MessageType.TRAIN
        w = msg.content["arrays"].to_numpy_ndarrays()[0]
        return RecordDict({"arrays": ArrayRecord([w + self.step]),
                           "metrics": MetricRecord({"num-examples": self.examples,
                                                    "loss": float(self.step.sum())})})


def test_fedavg_rounds_report_the_spread_and_keep_the_aggregate():
    steps = {1: np.array([1.0, 0.0]), 2: np.array([-1.0, 2.0])}
    grid = InProcessGrid({n: StepClient(s, 10) for n, s in steps.items()})
    strategy = ClientSpread(FedAvg(min_available_nodes=2, min_train_nodes=2, fraction_evaluate=0.0))
    result = strategy.start(grid, ArrayRecord([np.zeros(2)]), num_rounds=2,
                            train_config=ConfigRecord({}))
    np.testing.assert_allclose(result.arrays.to_numpy_ndarrays()[0], [0.0, 2.0])  # 2 x mean step
    for r in (1, 2):  # the spread is measured from the round's own start: same each round
        m = result.train_metrics_clientapp[r]
        assert m["client-distance"] == pytest.approx(np.sqrt(2))   # each step is (±1, ±1) off the mean
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


@pytest.mark.parametrize("inner", [partial(QFedAvg, client_learning_rate=0.1, train_loss_key="loss"), Bulyan],
                         ids=["QFedAvg", "Bulyan"])
def test_strategies_that_consume_what_they_read_keep_their_aggregate(inner, frozen):
    """QFedAvg empties the weights it sent and the replies, Bulyan the replies, as they read them
    (``keep_input=False``): the spread comes from what was there before."""
    steps = {1: np.array([1.0, 0.0]), 2: np.array([-1.0, 2.0]), 3: np.array([0.0, 1.0])}

    def run(strategy):
        grid = InProcessGrid({n: StepClient(s, 10) for n, s in steps.items()})
        return strategy.start(grid, ArrayRecord([np.zeros(2)]), num_rounds=2, train_config=ConfigRecord({}))

    args = dict(min_available_nodes=3, min_train_nodes=3, fraction_evaluate=0.0)
    alone, wrapped = run(inner(**args)), run(ClientSpread(inner(**args)))
    np.testing.assert_array_equal(wrapped.arrays.to_numpy_ndarrays()[0], alone.arrays.to_numpy_ndarrays()[0])
    assert wrapped.train_metrics_clientapp[1]["update-norm"] == pytest.approx((2 + np.sqrt(5)) / 3)
