"""RoundConfig: through Flower's FedAvg, each round's clients receive that round's scheduled
values over the config given, and a round the schedule leaves out gets the config as given."""

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim_strategies.round_config import RoundConfig


def lr_client(msg):
    """'Trains' by a step of its config's lr along (1, 1)."""
    assert msg.metadata.message_type == MessageType.TRAIN
    w = msg.content["arrays"].to_numpy_ndarrays()[0]
    config = msg.content["config"]
    assert config["tag"] == "kept"  # the given config's other values reach every round
    return RecordDict(
        {
            "arrays": ArrayRecord([w + config["lr"]]),
            "metrics": MetricRecord({"num-examples": 1}),
        }
    )


def test_each_round_trains_with_its_scheduled_value():
    grid = InProcessGrid({1: lr_client, 2: lr_client})
    strategy = RoundConfig(
        FedAvg(min_available_nodes=2, min_train_nodes=2, fraction_evaluate=0.0),
        {1: {"lr": 0.5}, 3: {"lr": 0.25}},
    )
    result = strategy.start(
        grid,
        ArrayRecord([np.zeros(2)]),
        num_rounds=3,
        train_config=ConfigRecord({"lr": 2.0, "tag": "kept"}),
    )
    # rounds: 0.5 (scheduled), 2.0 (as given), 0.25 (scheduled)
    np.testing.assert_allclose(result.arrays.to_numpy_ndarrays()[0], [2.75, 2.75])
