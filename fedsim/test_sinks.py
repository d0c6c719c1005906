"""The per-exchange sinks: CSV rows and TensorBoard scalars a user can watch during a run."""

from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.inprocess_grid import InProcessGrid
from fedsim.messaging import Messenger
from fedsim.metric_keys import DP_EPSILON
from fedsim.sinks import Sinks
from fedsim.test_journal import _grid, _rounds


def test_csv_sink_rows(tmp_path):
    sinks = Sinks(tmp_path, to_csv=True)
    _rounds(Messenger(_grid([1, 2], []), timeout=5, sinks=sinks), range(1, 3))
    sinks.close()
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert rows[0] == "time,phase,round,name,value"
    loss = [r.split(",") for r in rows if ",metric/loss," in r]
    assert [(r[1], r[2], float(r[4])) for r in loss] == [("fit/train", "1", 1.5), ("fit/train", "2", 2.5)]


def test_tensorboard_scalars_per_phase_and_round(tmp_path):
    sinks = Sinks(tmp_path, tensorboard=True)
    _rounds(Messenger(_grid([1, 2, 3], []), timeout=5, sinks=sinks), range(1, 4))
    sinks.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    loss = events.Scalars("fit/train/metric/loss")
    assert [(e.step, e.value) for e in loss] == [(1, 2.0), (2, 3.0), (3, 4.0)]  # mean of pid + round
    assert [e.value for e in events.Scalars("fit/train/accepted")] == [3.0, 3.0, 3.0]


def test_dp_sgd_epsilon_is_kept_per_client_and_round(tmp_path):
    """A client's DP-SGD epsilon is its own: results.json gets it per client and round
    (``Messenger.epsilon``), metrics.csv the mean and the max, not only a mean."""
    sinks = Sinks(tmp_path, to_csv=True)
    messenger = Messenger(InProcessGrid({n: (lambda msg, n=n: RecordDict({"metrics": MetricRecord(
        {DP_EPSILON: float(n) * int(msg.content["config"]["server-round"])})})) for n in (1, 3)}),
        timeout=5, sinks=sinks)
    for rnd in (1, 2):
        messenger.exchange("dp/train", [Message(RecordDict({"config": ConfigRecord({"server-round": rnd})}),
                                                dst_node_id=n, message_type=MessageType.TRAIN) for n in (1, 3)],
                           server_round=rnd)
    sinks.close()
    assert messenger.epsilon == {"dp/train": {1: {1: 1.0, 3: 3.0}, 2: {1: 2.0, 3: 6.0}}}
    rows = [r.split(",") for r in (tmp_path / "metrics.csv").read_text().splitlines()]
    assert [float(r[4]) for r in rows if r[3] == f"metric/{DP_EPSILON}-max"] == [3.0, 6.0]
