"""Rounds on the virtual clock through the run's one messaging path: Flower's FedAvg with a
deadline and over-selection, FedBuff and FedAsync. The same seed gives the same schedule and
model; a run killed mid-way and resumed from its journal keeps the virtual clock; FedBuff's and
FedAsync's steps are their papers' formulas."""

import random

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedsim.clock.schedule import VirtualClock
from fedsim.flower.strategies import strategy_utils
from fedsim.message_keys import PARTITION_ID
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.journal import WHOAMI, Journal
from fedsim.runtime.messaging import ANY, Messenger, Policy
from fedsim.runtime.records import from_record, to_record
from fedsim_strategies.asynchronous import FedAsync, FedBuff

CLIENTS = 8
KEY = b"k" * 32
CLOCK = {  # 50 s online of every 100, 1 to 10 s of training: some clients drop out
    "kind": "synthetic",
    "deadline": 12.0,
    "over_selection": 1.5,
    "synthetic": {
        "seconds_per_example": 0.05,
        "speed_sigma": 0.8,
        "kbps": 200.0,
        "bandwidth_sigma": 0.8,
        "online_hours": 12.0,
        "day_seconds": 100.0,
    },
}


class Killed(BaseException):
    """The server process dies mid-exchange (not an error a client reply could carry)."""


def _grid(node_ids, calls: list, kill_after: int | None) -> InProcessGrid:
    """Client p has 20 (p + 1) examples and moves the weights halfway to p."""

    def handler(p):
        def handle(msg):
            if WHOAMI in msg.content.config_records:
                return RecordDict({WHOAMI: ConfigRecord({PARTITION_ID: p})})
            if kill_after is not None and len(calls) >= kill_after:
                raise Killed
            calls.append(p)
            w = msg.content["arrays"]["w"].numpy()
            return RecordDict(
                {
                    "arrays": ArrayRecord({"w": Array(w + 0.5 * (p - w))}),
                    "metrics": MetricRecord({"num-examples": 20 * (p + 1)}),
                }
            )

        return handle

    return InProcessGrid({n: handler(p) for p, n in enumerate(node_ids)})


def _fedavg():
    return FedAvg(fraction_train=0.3, fraction_evaluate=0.0, min_train_nodes=3)


def _fedbuff():
    return FedBuff(concurrency=4, buffer_size=2, server_lr=1.0, fraction_evaluate=0.0)


def _fedasync():
    return FedAsync(concurrency=3, mixing=0.6, max_staleness=1, fraction_evaluate=0.0)


def _run(make, seed=0, journal=None, kill_after=None, node_ids=range(11, 11 + CLIENTS)):
    """(the clock's report, the final weights, the clients' calls) of 6 rounds of ``make()``."""
    calls = []
    messenger = Messenger(
        _grid(node_ids, calls, kill_after), 5, journal=journal, know_partitions=True
    )
    messenger.clock = VirtualClock.of(CLOCK, CLIENTS, seed)
    strategy_utils.random = random.Random(seed)  # as the ServerApp seeds Flower's sampler
    result = make().start(
        messenger.grid("t", Policy(ANY), need=3),
        to_record({"w": np.zeros(4, np.float32)}),
        num_rounds=6,
        train_config=ConfigRecord(),
    )
    return messenger.clock.report(), from_record(result.arrays)["w"].tolist(), calls


@pytest.fixture(autouse=True)
def _sampler():
    kept = strategy_utils.random
    yield
    strategy_utils.random = kept


@pytest.mark.parametrize("make", [_fedavg, _fedbuff, _fedasync])
def test_the_same_seed_gives_the_same_schedule_and_model(make):
    report, weights, calls = _run(make)
    assert _run(make) == (report, weights, calls)
    other = _run(make, seed=1)
    assert other[0]["rounds"] != report["rounds"]
    assert len(report["rounds"]) == 6
    for before, after in zip(report["rounds"], report["rounds"][1:]):
        assert before["virtual_end"] <= after["virtual_start"] + 1e-9
        assert after["virtual_start"] <= after["virtual_end"]


def test_a_round_leaves_stragglers_and_dropouts_out():
    """FedAvg samples 3 (3 x 1.5 rounded up is what the run's over-selection makes of a
    quota of 2; here 3 given) and waits for 2: the rest are stragglers; a client offline before
    its update arrives is a dropout; what the model averages is only the accepted updates."""
    report, _, calls = _run(_fedavg)
    rounds = report["rounds"]
    assert all(r["quota"] == 2 and r["accepted"] <= 2 for r in rounds)
    assert sum(r["stragglers"] for r in rounds) >= 1 and sum(r["dropouts"] for r in rounds) >= 1
    assert len(calls) == sum(len(r["clients"]) for r in rounds)  # every sampled client trained
    for r in rounds:
        accepted = [c["virtual_finish"] for c in r["clients"] if c["status"] == "accepted"]
        late = [c["virtual_finish"] for c in r["clients"] if c["status"] == "straggler"]
        assert all(a <= r["virtual_end"] + 1e-9 for a in accepted)
        assert all(f >= max(accepted, default=0) for f in late)


@pytest.mark.parametrize("make, kill_after", [(_fedavg, 7), (_fedbuff, 9), (_fedasync, 6)])
def test_a_resumed_run_keeps_the_virtual_clock(tmp_path, make, kill_after):
    whole = _run(make)
    with pytest.raises(Killed):
        _run(make, journal=Journal(tmp_path, resume=False, key=KEY), kill_after=kill_after)
    replayed = len(list(tmp_path.glob("*.exchange")))
    assert replayed >= 2
    report, weights, calls = _run(
        make, journal=Journal(tmp_path, resume=True, key=KEY), node_ids=range(71, 71 + CLIENTS)
    )
    assert (report, weights) == whole[:2]
    assert len(calls) < len(whole[2])  # the journaled exchanges were not sent again


def test_fedbuff_steps_by_the_mean_of_staleness_scaled_updates():
    strategy = FedBuff(buffer_size=2, server_lr=0.5, staleness_exponent=0.5)
    w, sent = {"w": np.array([1.0])}, {"w": np.array([0.0])}
    assert strategy.take(w, sent, {"w": np.array([2.0])}, staleness=0) is None
    new = strategy.take(w, sent, {"w": np.array([4.0])}, staleness=3)
    # 1 + 0.5 * (2 / sqrt(1) + 4 / sqrt(4)) / 2
    assert new["w"].tolist() == pytest.approx([1.0 + 0.5 * (2.0 + 2.0) / 2])


def test_fedasync_mixes_each_update_by_its_staleness():
    strategy = FedAsync(mixing=0.6, staleness_exponent=1.0)
    new = strategy.take({"w": np.array([1.0])}, {}, {"w": np.array([4.0])}, staleness=2)
    a = 0.6 / 3
    assert new["w"].tolist() == pytest.approx([(1 - a) * 1.0 + a * 4.0])


def test_an_asynchronous_strategy_without_a_clock_is_refused():
    messenger = Messenger(_grid(range(1, 3), [], None), 5, know_partitions=True)
    with pytest.raises(ValueError, match="runs on the virtual clock"):
        _fedbuff().start(messenger.grid("t"), to_record({"w": np.zeros(1)}), num_rounds=1)
