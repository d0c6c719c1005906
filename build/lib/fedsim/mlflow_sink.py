"""Per-exchange metric rows to an MLflow store (``logging.mlflow``), beside metrics.csv and
TensorBoard: for comparing runs and sweeps in ``mlflow ui`` rather than one run's files.

The store is SQLite, ``<logging.mlflow_dir>/mlflow.db``: MLflow's default backend (MLflow 3.17
refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE=true``). One MLflow experiment per fedsim
experiment (``protocol.name``), one MLflow run per fedsim run, named after its results folder,
with the resolved config as params and each row's values as metrics ``<phase>/<name>`` at
step = round, as TensorBoard's tags. MLflow names allow no ``@`` (and a few more): those
become ``_`` (``metric/ndcg@10`` is ``metric/ndcg_10``).

A resumed run replays its journaled exchanges into the sinks: its earlier MLflow run (tag
``fedsim.run_key``, the same across a resume) is deleted and the new one holds the whole run, so
nothing repeats, as metrics.csv is rewritten.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

RUN_KEY_TAG = "fedsim.run_key"
_NOT_IN_NAMES = re.compile(r"[^/\w.\- ]")


def store_uri(folder: str | Path) -> str:
    """The tracking URI of the store in ``folder`` (what ``mlflow ui --backend-store-uri`` takes)."""
    return f"sqlite:///{Path(folder) / 'mlflow.db'}"


def flat_params(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: ``{"a": {"b": 1}}`` is ``{"a.b": "1"}``."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


class MlflowSink:
    """One MLflow run that gets every exchange's row; see the module's docstring."""

    def __init__(self, folder: str | Path, experiment: str, run_name: str, run_key: str,
                 params: dict[str, str]):
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # a run reports nothing to MLflow's servers
        from mlflow.entities import Param  # only when asked: MLflow's import takes a second
        from mlflow.tracking import MlflowClient

        Path(folder).mkdir(parents=True, exist_ok=True)
        self._client = client = MlflowClient(tracking_uri=store_uri(folder))
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(
            experiment, artifact_location=(Path(folder) / "artifacts").as_uri())
        for earlier in client.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'"):
            client.delete_run(earlier.info.run_id)
        self.run_id = client.create_run(experiment_id, run_name=run_name,
                                        tags={RUN_KEY_TAG: run_key}).info.run_id
        client.log_batch(self.run_id, params=[Param(k, v) for k, v in params.items()])

    @classmethod
    def for_run(cls, cfg: DictConfig) -> MlflowSink:
        """The sink of the run ``cfg`` describes (its run key set by the ServerApp)."""
        return cls(cfg.logging.mlflow_dir, cfg.protocol.name, Path(cfg.results_dir).name,
                   cfg.client_state.run_key, flat_params(OmegaConf.to_container(cfg, resolve=True)))

    def write(self, phase: str, server_round: int, numbers: dict[str, float], now: float) -> None:
        from mlflow.entities import Metric

        self._client.log_batch(self.run_id, metrics=[
            Metric(_NOT_IN_NAMES.sub("_", f"{phase}/{key}"), value, int(now * 1000), server_round)
            for key, value in numbers.items()])

    def close(self, failed: bool = False) -> None:
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
