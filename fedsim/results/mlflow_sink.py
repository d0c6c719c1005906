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

At the end of a run the ServerApp adds its headline metrics (``headline/<results path>``, the
experiment's ``sweep.metrics``) and its result files as artifacts; ``fedsim run`` then adds what
only it knows (:func:`annotate`: the commit as MLflow's source tag, the command, the files with
the whole provenance). A sweep is a :class:`SweepRun` whose children are its points' runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

RUN_KEY_TAG = "fedsim.run_key"
SWEEP_FOLDER_TAG = "fedsim.sweep_folder"  # the folder a sweep's MLflow run was made for
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

    def __init__(
        self,
        folder: str | Path,
        experiment: str,
        run_name: str,
        run_key: str,
        params: dict[str, str],
    ):
        from mlflow.entities import Param  # only when asked: MLflow's import takes a second

        self._client = client = _client(folder)
        experiment_id = _experiment_id(client, experiment, folder)
        for earlier in _runs_of(client, experiment_id, run_key):
            client.delete_run(earlier.info.run_id)
        self.run_id = client.create_run(
            experiment_id, run_name=run_name, tags={RUN_KEY_TAG: run_key}
        ).info.run_id
        client.log_batch(self.run_id, params=[Param(k, v) for k, v in params.items()])

    @classmethod
    def for_run(cls, cfg: DictConfig) -> MlflowSink:
        """The sink of the run ``cfg`` describes (its run key set by the ServerApp)."""
        return cls(
            cfg.logging.mlflow_dir,
            cfg.protocol.name,
            Path(cfg.results_dir).name,
            cfg.client_state.run_key,
            flat_params(OmegaConf.to_container(cfg, resolve=True)),
        )

    def write(self, phase: str, server_round: int, numbers: dict[str, float], now: float) -> None:
        self.metrics({f"{phase}/{key}": value for key, value in numbers.items()}, server_round, now)

    def metrics(self, numbers: dict[str, float], step: int, now: float) -> None:
        """``numbers`` as metrics at ``step``, named as MLflow allows."""
        log_metrics(self._client, self.run_id, numbers, step, now)

    def artifacts(self, paths: list[Path]) -> None:
        for path in paths:
            self._client.log_artifact(self.run_id, str(path))

    def close(self, failed: bool = False) -> None:
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


def _client(folder: str | Path):
    os.environ.setdefault(
        "MLFLOW_DISABLE_TELEMETRY", "true"
    )  # a run reports nothing to MLflow's servers
    from mlflow.tracking import MlflowClient  # only when asked: MLflow's import takes a second

    Path(folder).mkdir(parents=True, exist_ok=True)
    return MlflowClient(tracking_uri=store_uri(folder))


def _experiment_id(client, experiment: str, folder: str | Path) -> str:
    found = client.get_experiment_by_name(experiment)
    return (
        found.experiment_id
        if found
        else client.create_experiment(
            experiment, artifact_location=(Path(folder) / "artifacts").as_uri()
        )
    )


def _runs_of(client, experiment_id: str, run_key: str) -> list:
    return client.search_runs([experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'")


def log_metrics(client, run_id: str, numbers: dict[str, float], step: int, now: float) -> None:
    from mlflow.entities import Metric

    client.log_batch(
        run_id,
        metrics=[
            Metric(_NOT_IN_NAMES.sub("_", key), value, int(now * 1000), step)
            for key, value in numbers.items()
        ],
    )


def source_tags(prov: dict) -> dict[str, str]:
    """MLflow's own source tags (the UI shows the commit) from a ``provenance`` record."""
    git = prov.get("git", {})
    return {
        k: str(v)
        for k, v in {
            "mlflow.source.git.commit": git.get("commit"),
            "fedsim.git_dirty": git.get("dirty"),
            "mlflow.source.name": prov.get("command", {}).get("line"),
        }.items()
        if v is not None
    }


def annotate(results_dir: Path, prov: dict, artifacts: list[Path]) -> None:
    """After ``fedsim run``: the run's MLflow run (found by its run key, from its config.yaml)
    gets the commit and command that only the launching process knows, and ``artifacts``
    again (the summary and results.json, now with the whole provenance)."""
    cfg = OmegaConf.load(results_dir / "config.yaml")
    client = _client(cfg.logging.mlflow_dir)
    for run in _runs_of(
        client,
        _experiment_id(client, cfg.protocol.name, cfg.logging.mlflow_dir),
        cfg.client_state.run_key,
    ):
        for key, value in source_tags(prov).items():
            client.set_tag(run.info.run_id, key, value)
        for path in artifacts:
            client.log_artifact(run.info.run_id, str(path))


class SweepRun:
    """A sweep's MLflow run, the parent of its points' runs (tag ``mlflow.parentRunId``, which
    ``mlflow ui`` nests them by); reopened by its id when the sweep is resumed, if it is this
    sweep folder's (tag ``fedsim.sweep_folder``): the id comes from the manifest, a record's file,
    and another run's (the user's earlier sweep, named in a record they shared) was reopened and
    given this record's comparison; one not in the store ended the resume in a traceback."""

    def __init__(
        self,
        folder: str | Path,
        experiment: str,
        sweep_folder: Path,
        run_id: str | None,
        prov: dict,
        params: dict[str, str],
    ):
        from mlflow.entities import Param

        self._client = client = _client(folder)
        self._folder = folder
        self._experiment_id = _experiment_id(client, experiment, folder)
        if self._of_this_sweep(run_id, sweep_folder):
            client.update_run(run_id, status="RUNNING")
        else:
            run_id = client.create_run(
                self._experiment_id,
                run_name=sweep_folder.name,
                tags={**source_tags(prov), SWEEP_FOLDER_TAG: str(sweep_folder)},
            ).info.run_id
            client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
        self.run_id = run_id

    def _of_this_sweep(self, run_id, sweep_folder: Path) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(run_id) if isinstance(run_id, str) else None
        except MlflowException:  # not in this store
            return False
        return (
            run is not None
            and run.info.experiment_id == self._experiment_id
            and run.data.tags.get(SWEEP_FOLDER_TAG) == str(sweep_folder)
        )

    def adopt(self, point_dir: Path) -> None:
        """The point's run (found by the run key in its config.yaml) becomes this run's child."""
        key = OmegaConf.load(point_dir / "config.yaml").client_state.run_key
        for run in _runs_of(self._client, self._experiment_id, key):
            self._client.set_tag(run.info.run_id, "mlflow.parentRunId", self.run_id)

    def stop(self) -> None:
        """The sweep was interrupted: KILLED until a resume reopens it."""
        self._client.set_terminated(self.run_id, "KILLED")

    def close(
        self, numbers: dict[str, float], artifacts: list[Path], now: float, failed: bool
    ) -> None:
        log_metrics(self._client, self.run_id, numbers, 0, now)
        for path in artifacts:
            self._client.log_artifact(self.run_id, str(path))
        self._client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
