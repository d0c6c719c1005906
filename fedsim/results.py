"""Run outputs: resolved config, results.json, a markdown summary, plots and errors."""

from __future__ import annotations

import json
import math
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


class RunOutput:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

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
