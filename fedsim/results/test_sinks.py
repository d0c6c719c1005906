"""The per-exchange sinks: CSV rows, TensorBoard scalars and MLflow metrics a user can watch
during a run."""

import time

import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedsim.config.compose import ConfigError, compose
from fedsim.config.schema import check
from fedsim.message_keys import DP_EPSILON
from fedsim.privacy.plan import DPSGDLedger
from fedsim.results.mlflow_sink import RUN_KEY_TAG, MlflowSink, store_uri
from fedsim.results.outputs import RunOutput
from fedsim.results.sinks import Sinks, tensorboard_text
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger
from fedsim.runtime.test_journal import _grid, _rounds


def test_csv_sink_rows(tmp_path):
    sinks = Sinks(tmp_path, to_csv=True)
    _rounds(Messenger(_grid([1, 2], []), timeout=5, sinks=sinks), range(1, 3))
    sinks.close()
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert rows[0] == "time,phase,round,name,value"
    loss = [r.split(",") for r in rows if ",metric/loss," in r]
    assert [(r[1], r[2], float(r[4])) for r in loss] == [
        ("fit/train", "1", 1.5),
        ("fit/train", "2", 2.5),
    ]


def test_tensorboard_scalars_per_phase_and_round(tmp_path):
    sinks = Sinks(tmp_path, tensorboard=True)
    _rounds(Messenger(_grid([1, 2, 3], []), timeout=5, sinks=sinks), range(1, 4))
    sinks.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    loss = events.Scalars("fit/train/metric/loss")
    assert [(e.step, e.value) for e in loss] == [
        (1, 2.0),
        (2, 3.0),
        (3, 4.0),
    ]  # mean of partition id + round
    assert [e.value for e in events.Scalars("fit/train/accepted")] == [3.0, 3.0, 3.0]


def test_tensorboard_never_writes_through_a_link_at_its_folder(tmp_path, victim_home):
    """A ``tensorboard`` link planted in a results folder had the event files written where it
    pointed (``~/.ssh``): rmtree refuses a link, and the writer followed it."""
    (tmp_path / "tensorboard").symlink_to(victim_home / ".ssh", target_is_directory=True)
    Sinks(tmp_path, tensorboard=True).close()
    assert (
        list((victim_home / ".ssh").iterdir()) == [] and not (tmp_path / "tensorboard").is_symlink()
    )
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_dp_sgd_epsilon_is_kept_per_client_and_round(tmp_path):
    """A client's DP-SGD epsilon is its own: results.json gets it per client and round
    (the privacy plan's DP-SGD ledger, fed by the Messenger), metrics.csv the mean and the max,
    not only a mean."""
    sinks, ledger = Sinks(tmp_path, to_csv=True), DPSGDLedger()
    messenger = Messenger(
        InProcessGrid(
            {
                n: (
                    lambda msg, n=n: RecordDict(
                        {
                            "metrics": MetricRecord(
                                {DP_EPSILON: float(n) * int(msg.content["config"]["server-round"])}
                            )
                        }
                    )
                )
                for n in (1, 3)
            }
        ),
        timeout=5,
        sinks=sinks,
        ledgers=[ledger.record],
    )
    for rnd in (1, 2):
        messenger.exchange(
            "dp/train",
            [
                Message(
                    RecordDict({"config": ConfigRecord({"server-round": rnd})}),
                    dst_node_id=n,
                    message_type=MessageType.TRAIN,
                )
                for n in (1, 3)
            ],
            server_round=rnd,
        )
    sinks.close()
    assert ledger.epsilon == {"dp/train": {1: {1: 1.0, 3: 3.0}, 2: {1: 2.0, 3: 6.0}}}
    rows = [r.split(",") for r in (tmp_path / "metrics.csv").read_text().splitlines()]
    assert [float(r[4]) for r in rows if r[3] == f"metric/{DP_EPSILON}-max"] == [3.0, 6.0]


def _mlflow_run(tmp_path, run_key: str) -> MlflowSink:
    cfg = compose(
        [
            f"results_dir={tmp_path / 'results'}",
            "logging.mlflow=true",
            f"logging.mlflow_dir={tmp_path / 'mlflow'}",
            "seed=3",
        ]
    )
    cfg.client_state.run_key = run_key  # as the ServerApp sets it
    return MlflowSink.for_run(cfg)


def _active_runs(client: MlflowClient) -> list:
    return client.search_runs([client.get_experiment_by_name("fedtp").experiment_id])


def mlflow_history(client: MlflowClient, run) -> dict[str, list[tuple[int, float]]]:
    """Every metric of ``run``: name -> [(step, value)]."""
    return {
        key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
        for key in run.data.metrics
    }


def csv_history(path) -> dict[str, list[tuple[int, float]]]:
    """metrics.csv in the same shape: ``<phase>/<name>`` -> [(round, value)]."""
    out = {}
    for _, phase, rnd, name, value in (r.split(",") for r in path.read_text().splitlines()[1:]):
        out.setdefault(f"{phase}/{name}", []).append((int(rnd), float(value)))
    return out


def test_mlflow_run_holds_the_csv_rows_and_the_config(tmp_path):
    sinks = Sinks(tmp_path, to_csv=True, mlflow=_mlflow_run(tmp_path, "a1"))
    _rounds(Messenger(_grid([1, 2, 3], []), timeout=5, sinks=sinks), range(1, 4))
    sinks.write("eval/score", 2, {"metric/ndcg@10": 0.5})  # a name MLflow does not allow
    sinks.close()
    client = MlflowClient(tracking_uri=store_uri(tmp_path / "mlflow"))
    (run,) = _active_runs(client)
    assert (run.info.run_name, run.info.status, run.data.tags[RUN_KEY_TAG]) == (
        "results",
        "FINISHED",
        "a1",
    )
    params = run.data.params
    assert (params["seed"], params["strategy.noise_multiplier"], params["logging.mlflow"]) == (
        "3",
        "1.0",
        "True",
    )
    history, csv = mlflow_history(client, run), csv_history(tmp_path / "metrics.csv")
    assert history["fit/train/metric/loss"] == [
        (1, 2.0),
        (2, 3.0),
        (3, 4.0),
    ]  # mean of partition id + round
    assert (
        history.pop("eval/score/metric/ndcg_10")
        == csv.pop("eval/score/metric/ndcg@10")
        == [(2, 0.5)]
    )
    assert history == csv  # every value of every exchange, at its round


def test_a_resumed_run_replaces_its_mlflow_run_and_a_new_run_adds_one(tmp_path):
    _mlflow_run(tmp_path, "a1").write(
        "fit/train", 1, {"accepted": 2.0}, time.time()
    )  # killed: never closed
    resumed = _mlflow_run(tmp_path, "a1")
    resumed.write("fit/train", 1, {"accepted": 3.0}, time.time())
    resumed.close(failed=True)
    client = MlflowClient(tracking_uri=store_uri(tmp_path / "mlflow"))
    (run,) = _active_runs(client)
    assert run.info.run_id == resumed.run_id and run.info.status == "FAILED"
    assert [
        (m.step, m.value) for m in client.get_metric_history(run.info.run_id, "fit/train/accepted")
    ] == [(1, 3.0)]
    _mlflow_run(tmp_path, "b2").close()
    assert len(_active_runs(client)) == 2


def test_mlflow_settings_are_refused_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="logging.mlflow"):
        compose(["logging.mlflow=sometimes"])
    remote = ["hardware=deploy_remote", "hardware.superlink=127.0.0.1:9", "hardware.insecure=true"]
    with pytest.raises(ValueError, match="remote SuperLink"):
        check(compose([*remote, "logging.mlflow=true"]))
    (tmp_path / "store").write_text("")
    with pytest.raises(ValueError, match="logging.mlflow_dir must be a folder"):
        check(compose(["logging.mlflow=true", f"logging.mlflow_dir={tmp_path / 'store'}"]))
    check(compose([*remote, f"logging.mlflow_dir={tmp_path / 'store'}"]))  # off: nothing to refuse


def test_the_run_end_gives_tensorboard_and_mlflow_the_headline_config_summary_and_plots(tmp_path):
    out = RunOutput(tmp_path / "results")
    fig, ax, save = out.figure("curve")
    ax.plot([0, 1], [0, 1])
    save()
    (out.path / "summary.md").write_text("# toy\n")
    sinks = Sinks(out.path, tensorboard=True, mlflow=_mlflow_run(tmp_path, "a1"))
    sinks.finish({"m.acc": 0.5}, 3, "seed: 3\n", "# toy", out.files())
    sinks.close()
    tensorboard_text(
        out.path, "provenance", "commit abc"
    )  # fedsim run's own note, after the ServerApp's
    events = EventAccumulator(
        str(out.path / "tensorboard"), size_guidance={"tensors": 0, "images": 0}
    )
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("headline/m.acc")] == [(3, 0.5)]
    texts = {
        t: events.Tensors(t)[0].tensor_proto.string_val[0].decode()
        for t in events.Tags()["tensors"]
    }
    assert texts == {
        "config/text_summary": "    seed: 3",
        "summary/text_summary": "# toy",
        "provenance/text_summary": "commit abc",
    }
    assert events.Tags()["images"] == ["plots/curve"]
    client = MlflowClient(tracking_uri=store_uri(tmp_path / "mlflow"))
    (run,) = _active_runs(client)
    assert client.get_metric_history(run.info.run_id, "headline/m.acc")[0].value == 0.5
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"curve.png", "summary.md"}
