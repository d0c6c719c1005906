"""TrustAlpha through Flower messages (in-process grid, real wire format): the schedule each
round sends, the plain mean, the alphas recorded; clients here mix as FedDTRE's do."""

import json

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger
from fedsim.runtime.records import from_record, to_record
from fedsim.trust_mixing import ALPHA, MIXING, S_GLOBAL, S_LOCAL, client_alpha, mix
from fedsim_strategies.trust_alpha import TrustAlpha, k_at, plain_mean


def test_k_grows_linearly_from_k0():
    assert [k_at(t, 0.7, 0.1) for t in (1, 2, 11)] == pytest.approx([0.7, 0.8, 1.7])
    with pytest.raises(ValueError):
        k_at(0, 0.7, 0.1)


def test_plain_mean_ignores_data_sizes():
    mean = plain_mean(
        [{"w": np.array([0.0, 2.0], np.float32)}, {"w": np.array([4.0, 4.0], np.float32)}]
    )
    np.testing.assert_allclose(mean["w"], [2.0, 3.0])
    assert mean["w"].dtype == np.float32


def _client(local_value: float, s_local: float, s_global: float, examples: int, seen: list):
    """Trains to ``local_value``; trust scores fixed; mixes by the message's schedule."""

    def handle(msg):
        config = msg.content["config"]
        mixing = json.loads(config[MIXING])
        seen.append((int(config["server-round"]), mixing))
        global_ = from_record(msg.content["arrays"])
        local = {"w": np.full_like(global_["w"], local_value)}
        alpha, scores = client_alpha(
            mixing, lambda which: [{"local": s_local, "global": s_global}[which]] * 2
        )
        return RecordDict(
            {
                "arrays": to_record(mix(local, global_, alpha)),
                "metrics": MetricRecord({"num-examples": examples, ALPHA: alpha, **scores}),
            }
        )

    return handle


def test_rounds_send_the_schedule_and_average_plainly():
    seen = []
    grid = Messenger(
        InProcessGrid(
            {
                1: _client(1.0, 0.3, 0.3, 10, seen),  # delta 0: alpha_min
                2: _client(3.0, 0.0, 1.0, 1000, seen),
            }
        ),  # delta 1: alpha_max
        timeout=5,
    ).grid("t")
    strategy = TrustAlpha(
        k0=0.7,
        k_growth=0.5,
        midpoint=0.01,
        alpha_min=0.1,
        alpha_max=1.0,
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=2,
        min_available_nodes=2,
    )
    result = strategy.start(
        grid,
        to_record({"w": np.zeros(2, np.float32)}),
        num_rounds=2,
        timeout=5,
        train_config=ConfigRecord({}),
    )
    assert sorted({(r, m["k"]) for r, m in seen}) == [(1, 0.7), (2, 1.2)]
    assert all(
        m["alpha_min"] == 0.1 and m["alpha_max"] == 1.0 and m["midpoint"] == 0.01 for _, m in seen
    )
    # round 1: client 1 sends 0.9*1 + 0.1*0 = 0.9, client 2 sends the global 0: plain mean 0.45
    # round 2: client 1 sends 0.9*1 + 0.1*0.45 = 0.945, client 2 the global 0.45: mean 0.6975
    np.testing.assert_allclose(from_record(result.arrays)["w"], [0.6975, 0.6975], rtol=1e-6)
    assert sorted(r[ALPHA] for r in strategy.alphas[1]) == pytest.approx([0.1, 1.0])
    assert sorted(r[S_GLOBAL] - r[S_LOCAL] for r in strategy.alphas[2]) == pytest.approx([0.0, 1.0])


def test_a_fixed_alpha_needs_no_trust_scores():
    seen = []
    grid = Messenger(
        InProcessGrid({1: _client(2.0, 0.0, 0.0, 1, seen), 2: _client(4.0, 0.0, 0.0, 1, seen)}),
        timeout=5,
    ).grid("t")
    strategy = TrustAlpha(
        fixed_alpha=0.25,
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=2,
        min_available_nodes=2,
    )
    assert not strategy.scores_trust
    result = strategy.start(
        grid, to_record({"w": np.zeros(1, np.float32)}), num_rounds=1, timeout=5
    )
    assert [m for _, m in seen] == [{"fixed_alpha": 0.25}] * 2
    np.testing.assert_allclose(from_record(result.arrays)["w"], [0.75 * 3.0])
    assert all(set(r) == {"node", ALPHA} for r in strategy.alphas[1])


@pytest.mark.parametrize(
    "kwargs", [{"alpha_min": 0.5, "alpha_max": 0.4}, {"fixed_alpha": 1.5}, {"k0": 0.0}]
)
def test_bad_schedules_are_refused(kwargs):
    with pytest.raises(ValueError):
        TrustAlpha(**kwargs)


def test_a_reply_of_another_shape_is_counted_malformed_not_fatal():
    """plain_mean of arrays of different shapes would stop the run; such a reply (or one
    missing a key) is left out and counted, and the others are averaged."""
    seen = []

    def wrong_shape(msg):
        return RecordDict(
            {
                "arrays": to_record({"w": np.zeros(3, np.float32)}),
                "metrics": MetricRecord({"num-examples": 1, ALPHA: 0.5}),
            }
        )

    messenger = Messenger(
        InProcessGrid(
            {1: _client(2.0, 0.0, 0.0, 1, seen), 2: _client(4.0, 0.0, 0.0, 1, seen), 3: wrong_shape}
        ),
        timeout=5,
    )
    strategy = TrustAlpha(
        fixed_alpha=0.0,
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=3,
        min_available_nodes=3,
    )
    result = strategy.start(
        messenger.grid("t"), to_record({"w": np.zeros(2, np.float32)}), num_rounds=1, timeout=5
    )
    assert messenger.faults["t/train"][1]["malformed"] == 1
    np.testing.assert_allclose(from_record(result.arrays)["w"], [3.0, 3.0])
