"""Per-exchange metric rows, for watching a long run while it goes: a CSV, TensorBoard, MLflow.

The Messenger hands every completed exchange (a round's training, an evaluation piece, a
regroup, an HE chunk...) here as one row: sent / accepted / failed / timed-out clients, seconds,
bytes, and the mean over the accepted replies of each scalar metric they carry (``metric/...``,
e.g. a round's mean training loss). ``metrics.csv`` holds one line per (exchange, value);
TensorBoard (``torch.utils.tensorboard``) one scalar per value, tag ``<phase>/<name>``, step the
round; MLflow (``fedsim/results/mlflow_sink.py``) the same metrics in a store shared by runs. On resume
each is rewritten from the replayed exchanges, so nothing repeats.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import time
from pathlib import Path

from flwr.app import Message, MetricRecord
from matplotlib.image import imread

from fedsim.results.mlflow_sink import MlflowSink
from fedsim.results.outputs import create_new


def reply_metrics(replies: list[Message]) -> dict[str, float]:
    """The mean of each finite scalar metric over the replies that carry it."""
    values: dict[str, list[float]] = {}
    for msg in replies:
        for record in msg.content.values():  # not .metric_records: Flower builds a checked dict
            if not isinstance(record, MetricRecord):
                continue
            for key, value in record.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    values.setdefault(f"metric/{key}", []).append(float(value))
    return {k: sum(v) / len(v) for k, v in values.items()}


class Sinks:
    """The run's metric sinks; none when no folder is given (tests, strategies on a plain Grid)."""

    def __init__(
        self,
        folder: str | Path | None = None,
        to_csv: bool = False,
        tensorboard: bool = False,
        mlflow: MlflowSink | None = None,
    ):
        self._csv = self._writer = None
        self._fh = None
        self._mlflow = mlflow
        if folder is None:
            return
        folder = Path(folder)
        if to_csv:
            (folder / "metrics.csv").unlink(
                missing_ok=True
            )  # a resume writes it anew (a link: only the link)
            self._fh = os.fdopen(create_new(folder / "metrics.csv"), "w", newline="")
            self._csv = csv.writer(self._fh)
            self._csv.writerow(["time", "phase", "round", "name", "value"])
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # only when asked: imports torch

            logdir = folder / "tensorboard"
            if logdir.is_symlink():  # rmtree refuses a link, and the writer would follow it
                logdir.unlink()
            shutil.rmtree(logdir, ignore_errors=True)
            self._writer = SummaryWriter(str(logdir))

    def write(self, phase: str, server_round: int, row: dict[str, float]) -> None:
        now = time.time()
        numbers = {k: float(v) for k, v in row.items() if isinstance(v, (int, float))}
        if self._csv is not None:
            self._csv.writerows([now, phase, server_round, k, v] for k, v in numbers.items())
            self._fh.flush()
        if self._writer is not None:
            for key, value in numbers.items():
                self._writer.add_scalar(f"{phase}/{key}", value, server_round, walltime=now)
            self._writer.flush()
        if self._mlflow is not None:
            self._mlflow.write(phase, server_round, numbers, now)

    def finish(
        self,
        headline: dict[str, float],
        step: int,
        config_yaml: str,
        summary: str,
        files: list[Path],
    ) -> None:
        """The run's end: its headline metrics (``sweep.metrics`` of results.json) at ``step``,
        tag ``headline/<path>``; TensorBoard also gets the composed config and the summary as
        text and the plots as images, MLflow the ``files`` as artifacts (its params hold the
        config already)."""
        now = time.time()
        if self._writer is not None:
            for key, value in headline.items():
                self._writer.add_scalar(f"headline/{key}", value, step, walltime=now)
            self._writer.add_text("config", _indented(config_yaml), step)
            self._writer.add_text("summary", summary, step)
            for png in (f for f in files if f.suffix == ".png"):
                self._writer.add_image(
                    f"plots/{png.stem}", imread(png)[..., :3], step, dataformats="HWC"
                )
            self._writer.flush()
        if self._mlflow is not None:
            self._mlflow.metrics({f"headline/{k}": v for k, v in headline.items()}, step, now)
            self._mlflow.artifacts(files)

    def close(self, failed: bool = False) -> None:
        if self._fh is not None:
            self._fh.close()
        if self._writer is not None:
            self._writer.close()
        if self._mlflow is not None:
            self._mlflow.close(failed)


def _indented(text: str) -> str:
    """Markdown code (TensorBoard renders its text as markdown)."""
    return "\n".join(f"    {line}" for line in text.splitlines())


def tensorboard_text(folder: str | Path, tag: str, text: str) -> None:
    """Add ``text`` to a finished run's TensorBoard log (a new event file beside the run's)."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(Path(folder) / "tensorboard")) as writer:
        writer.add_text(tag, text)
