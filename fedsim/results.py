"""Run outputs: resolved config, results.json, a markdown summary, plots and errors."""

from __future__ import annotations

import base64
import io
import json
import math
import tarfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no inf/NaN; null means "unbounded" (e.g. epsilon at sigma = 0)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return _jsonable(value.item())
    return value


RESULTS_MARKER = "FEDSIM-RESULTS "
CHUNK_CHARS = 4096


def ship_results(folder: Path) -> list[str]:
    """The folder as log lines (a base64 tar.gz in numbered chunks): how the results of a run on a
    remote SuperLink reach the user's machine through the run's log stream, without shell access
    to the SuperLink host (Flower's ``flwr pull`` needs an artifact store a self-hosted SuperLink
    does not have)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(folder.iterdir()):
            tar.add(path, arcname=path.name)
    text = base64.b64encode(buffer.getvalue()).decode()
    chunks = [text[i:i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)]
    return [f"{RESULTS_MARKER}{i}/{len(chunks)} {chunk}" for i, chunk in enumerate(chunks)]


def unpack_results(lines: list[str], folder: Path) -> None:
    """Write what :func:`ship_results` sent into ``folder``; refuse an incomplete shipment."""
    chunks = {}
    for line in lines:
        head, chunk = line[len(RESULTS_MARKER):].split(" ", 1)
        index, total = map(int, head.split("/"))
        chunks[index] = chunk.strip()
    if sorted(chunks) != list(range(total)):
        raise ValueError(f"results arrived incomplete: {len(chunks)} of {total} chunks")
    data = base64.b64decode("".join(chunks[i] for i in range(total)))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


class RunOutput:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def clear_outcome(self) -> None:
        """A resumed run starts without the killed run's outcome files."""
        for name in ("results.json", "summary.md", "error.txt"):
            (self.path / name).unlink(missing_ok=True)

    def write_config(self, cfg: DictConfig) -> None:
        (self.path / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    def write_results(self, results: dict, summary_md: str) -> None:
        (self.path / "results.json").write_text(json.dumps(_jsonable(results), indent=2))
        (self.path / "summary.md").write_text(summary_md)

    def write_error(self, text: str) -> None:
        (self.path / "error.txt").write_text(text)

    def figure(self, name: str):
        """Context-free helper: a new figure whose ``save()`` writes ``<name>.png`` here."""
        fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
        path = self.path / f"{name}.png"

        def save():
            fig.tight_layout()
            fig.savefig(path)
            plt.close(fig)
            return path

        return fig, ax, save


def markdown_table(rows: list[dict], columns: list[str], digits: int = 4) -> str:
    def fmt(v):
        if v is None:
            return "inf"
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r[c]) if c in r else "" for c in columns) + " |"
              for r in rows]
    return "\n".join(lines)
