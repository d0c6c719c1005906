"""The ServerApp with ``logging.mlflow=true``, in process (the real ClientApp handler behind an
InProcessGrid, no Flower process): its MLflow run holds what metrics.csv holds and ends FINISHED,
or FAILED when the protocol fails."""

import json

import pytest
from mlflow.tracking import MlflowClient
from test_sharded_grid import supernodes

from fedsim.config.compose import compose
from fedsim.results.mlflow_sink import store_uri
from fedsim.results.outputs import RunOutput
from fedsim.results.test_sinks import csv_history, mlflow_history
from fedsim.runtime import server_app

CLIENTS = 4
RUN = [
    "experiment=fedtp_aggregate",
    "task.max_per_split=3",
    f"hardware.num_clients={CLIENTS}",
    "strategy.noise_multiplier=0",
    "num_rounds=2",
    "logging.mlflow=true",
]


def _run(tmp_path, *overrides: str) -> MlflowClient:
    cfg = compose(
        [
            *RUN,
            f"results_dir={tmp_path / 'results'}",
            f"logging.mlflow_dir={tmp_path / 'mlflow'}",
            *overrides,
        ]
    )
    server_app._run(supernodes(CLIENTS), cfg, RunOutput(cfg.results_dir))
    return MlflowClient(tracking_uri=store_uri(tmp_path / "mlflow"))


def test_a_run_logs_its_rows_config_headline_artifacts_and_outcome(tmp_path):
    client = _run(tmp_path)
    (run,) = client.search_runs([client.get_experiment_by_name("fedtp_aggregate").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["num_rounds"] == "2"
    history = mlflow_history(client, run)
    assert [step for step, _ in history["aggregate/train/accepted"]] == [1, 2]
    results = json.loads((tmp_path / "results" / "results.json").read_text())
    headline = {
        k: history.pop(f"headline/{k}") for k in ("ms_per_client_round", "strategy_seconds")
    }
    assert headline == {
        k: [(2, results[k])] for k in headline
    }  # the experiment's sweep.metrics, at the last round
    assert history == csv_history(tmp_path / "results" / "metrics.csv")
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "results.json", "summary.md"} <= artifacts


def test_a_failed_run_is_marked_failed(tmp_path):
    with pytest.raises(RuntimeError):  # no node answers in time
        _run(tmp_path, "round_timeout=0")
    client = MlflowClient(tracking_uri=store_uri(tmp_path / "mlflow"))
    (run,) = client.search_runs([client.get_experiment_by_name("fedtp_aggregate").experiment_id])
    assert run.info.status == "FAILED"
