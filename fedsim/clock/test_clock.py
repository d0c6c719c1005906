"""The virtual clock: a round of 5 clients read from FedScale-format traces, computed by hand;
the synthetic generator's draws; trace rows refused, named; a pickle naming code refused."""

import json
import pickle

import pytest

from fedsim.clock.schedule import ClockError, Task, VirtualClock
from fedsim.clock.traces import (
    Availability,
    Synthetic,
    TraceError,
    device_row,
    read_trace,
    synthetic_profiles,
    trace_profiles,
)

# FedScale's rows: ms per example of inference (training: 3x), kbit/s
DEVICES = {
    "0": {"computation": 10, "communication": 800},
    "1": {"computation": 20, "communication": 800},
    "2": {"computation": 40, "communication": 400},
    "3": {"computation": 5, "communication": 80},
    "4": {"computation": 100, "communication": 8000},
}
ALWAYS = {"active": [0], "inactive": [100], "finish_time": 100, "model": "x"}
WINDOWS = {str(p): ALWAYS for p in range(5)} | {"2": {**ALWAYS, "inactive": [10]}}


def _traces(tmp_path, devices=DEVICES, windows=WINDOWS):
    paths = tmp_path / "capacity.json", tmp_path / "behave.json"
    for path, rows in zip(paths, (devices, windows)):
        path.write_text(json.dumps(rows))
    return [str(p) for p in paths]


def _tasks(partitions):
    return [Task(p, 100, 10_000, 10_000) for p in partitions]  # 160 kbit each way and back


def test_five_clients_by_hand(tmp_path):
    clock = VirtualClock(trace_profiles(5, *_traces(tmp_path)), deadline=20.0, over_selection=5 / 3)
    # compute 100 examples x 3 x ms / 1000, plus 160 kbit / kbps:
    # 0: 3 + 0.2 = 3.2; 1: 6 + 0.2 = 6.2; 2: 12 + 0.4 = 12.4, offline at 10 (dropout);
    # 3: 1.5 + 2 = 3.5; 4: 30 + 0.02 = 30.02, past the deadline at 20 (straggler).
    # Quota 5 / (5/3) = 3: the third finisher (1, at 6.2) closes the round.
    assert clock.close_round("t", 1, _tasks(range(5))) == {0, 1, 3}
    first = clock.rounds[0]
    assert (first["virtual_start"], first["virtual_end"], first["quota"]) == (0.0, 6.2, 3)
    assert [(c["partition"], c["virtual_finish"], c["status"]) for c in first["clients"]] == [
        (0, pytest.approx(3.2), "accepted"),
        (3, pytest.approx(3.5), "accepted"),
        (1, pytest.approx(6.2), "accepted"),
        (4, pytest.approx(30.02), "straggler"),
        (2, None, "dropout"),
    ]
    assert (first["accepted"], first["stragglers"], first["dropouts"]) == (3, 1, 1)
    # round 2 from 6.2, quota 3 of 3 sampled: 0 at 9.4, 1 at 12.4, 4 at 36.22 > 26.2: the
    # quota is never met, the deadline closes the round
    clock.over_selection = 1.0
    assert clock.close_round("t", 2, _tasks([0, 1, 4])) == {0, 1}
    assert clock.now == pytest.approx(26.2)
    # client 2 is online [0, 10] of every 100 s: the next round waits for it until 100
    assert clock.wait_for([2], 1) == [2] and clock.now == 100.0
    report = clock.report()
    assert (report["stragglers"], report["dropouts"], report["virtual_seconds"]) == (2, 1, 100.0)


def test_an_online_window_across_the_period_end_holds():
    """A window from 80 to 10 of the next 100 s (two rows, as FedScale writes it) keeps a task
    that runs across the period's end."""
    window = Availability((0.0, 80.0), (10.0, 100.0), 100.0)
    assert window.online_until(95.0) == 110.0 and window.online_until(50.0) is None


def test_synthetic_profiles_follow_the_seed_per_client():
    settings = Synthetic(0.05, 0.8, 2000.0, 0.8, 12.0, 86400.0)
    five, ten = synthetic_profiles(5, 3, settings), synthetic_profiles(10, 3, settings)
    assert ten[:5] == five  # a client's draw is its own, whatever the population
    assert synthetic_profiles(5, 4, settings) != five
    assert len({p.device.seconds_per_example for p in ten}) == 10
    for p in ten:  # 12 hours of every day online
        spans = zip(p.availability.active, p.availability.inactive)
        assert sum(b - a for a, b in spans) == pytest.approx(43200.0)


@pytest.mark.parametrize(
    "row, why",
    [
        ({"computation": -1, "communication": 5}, "'computation' must be > 0"),
        ({"computation": 1}, "'communication' must be a finite number"),
        ({"computation": "fast", "communication": 5}, "'computation' must be a finite number"),
    ],
)
def test_a_bad_device_row_is_refused_by_its_key(tmp_path, row, why):
    devices, _ = _traces(tmp_path, {**DEVICES, "17": row})
    with pytest.raises(TraceError, match=f"row '17': {why}"):
        read_trace(devices, device_row)


@pytest.mark.parametrize(
    "row, why",
    [
        ({**ALWAYS, "active": [50], "inactive": [20]}, "intervals must be sorted"),
        ({**ALWAYS, "active": [0, 5]}, "of one length"),
        ({**ALWAYS, "inactive": [150]}, r"within \[0, finish_time=100\]"),
        ({**ALWAYS, "finish_time": 0}, "'finish_time' must be > 0"),
    ],
)
def test_a_bad_availability_row_is_refused_by_its_key(tmp_path, row, why):
    devices, windows = _traces(tmp_path, windows={**WINDOWS, "3": row})
    with pytest.raises(TraceError, match=f"row '3': .*{why}"):
        trace_profiles(5, devices, windows)


class _Planted:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_pickled_trace_naming_code_runs_none(tmp_path):
    """The attack: a trace file from elsewhere that, unpickled as FedScale does, runs what it
    names (here: creates a file). Its rows are refused and nothing runs."""
    marker, trace = tmp_path / "ran", tmp_path / "capacity.pkl"
    trace.write_bytes(pickle.dumps({1: {"computation": _Planted(marker), "communication": 5}}))
    with pytest.raises(TraceError, match="names io.open"):
        read_trace(trace, device_row)
    assert not marker.exists()
    trace.write_bytes(pickle.dumps({1: {"computation": 10.0, "communication": 5.0}}))
    assert read_trace(trace, device_row)[0].seconds_per_example == pytest.approx(0.03)


def test_a_quota_never_online_at_once_is_refused(tmp_path):
    """Two clients online apart, [0, 10] and [50, 60] of every 100 s: a round needing both never
    starts, and the clock says so rather than waiting forever."""
    windows = {
        "0": {"active": [0], "inactive": [10], "finish_time": 100},
        "1": {"active": [50], "inactive": [60], "finish_time": 100},
    }
    clock = VirtualClock(trace_profiles(2, *_traces(tmp_path, windows=windows)), None, 1.0)
    assert clock.wait_for([0, 1], 1) == [0]
    with pytest.raises(ClockError, match="never has 2 of 2 online at once"):
        clock.wait_for([0, 1], 2)


def test_the_quota_follows_the_sampled_clients_not_the_replies(tmp_path):
    """A sampled client whose reply failed (counted by the Messenger) still counts in the quota:
    6 sampled at over-selection 1.5 wait for 4, whether or not all 6 replied."""
    clock = VirtualClock(trace_profiles(5, *_traces(tmp_path)), None, 1.5)
    clock.close_round("t", 1, _tasks([0, 1, 3, 4]), sampled=6)
    assert clock.rounds[0]["quota"] == 4 and clock.rounds[0]["accepted"] == 4
