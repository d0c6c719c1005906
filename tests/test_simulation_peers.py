"""bench/simulation_peers.py --quick (issue 45), so that the comparison cannot rot: every
framework runs the workload in its own simulation, and with every client training in every
round, equal work must end on the same model (the same test loss up to the order of float sums)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.run.config import CONF_DIR
from fedsim.run.data import resolve_data_root

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


sys.path.insert(0, str(REPO / "bench"))
from simulation_peers import FRAMEWORKS, INSTALL  # noqa: E402


@pytest.mark.parametrize("package", sorted({package for _, _, package in FRAMEWORKS.values()}))
def test_each_framework_is_installed(package):
    """A peer missing here says so (the quick run below then reports it as not installed)."""
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed: {INSTALL}")


def test_quick_mode_runs_every_installed_framework_on_equal_work(tmp_path):
    from omegaconf import OmegaConf

    from fedsim_tasks.topical_chat.turn_sentiment import Recipe
    out = tmp_path / "peers"
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "simulation_peers.py"), "--quick", "--out", str(out)],
                          cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)}, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert [r["framework"] for r in rows] == list(FRAMEWORKS)
    installed = [r for r in rows if importlib.util.find_spec(FRAMEWORKS[r["framework"]][2])]
    assert not {r["framework"]: r["error"] for r in installed if "error" in r}
    assert all("not installed" in r["error"] for r in rows if r not in installed)
    rows = installed
    assert all(r["clients"] == r["per_round"] == 1000 and r["s_per_round"] > 0 and r["peak_gb"] > 0 for r in rows)
    task = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "task" / "turn_sentiment.yaml"))
    recipe = Recipe.of(task, str(resolve_data_root()))
    initial = recipe.evaluate(recipe.initial(seed=0))["loss"]
    losses = {r["framework"]: r["loss"] for r in rows}
    assert all(loss < initial for loss in losses.values()), (initial, losses)
    assert max(losses.values()) - min(losses.values()) < 1e-4, losses
    assert "| framework |" in proc.stdout and "goal <= 1.1x" in proc.stdout
