"""bench/simulation_peers.py in its quick setting (issue 45; 200 clients instead of --quick's 1,000
to keep CI well under 30 minutes), so that the comparison cannot rot: every
framework (fedsim in both layouts, plain Flower, pfl, FLGo) runs the workload in its own
simulation, and with every client training in every round, equal work must end on the same
model (the same test loss up to the order of float sums)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedsim.config.compose import CONF_DIR
from fedsim.config.data import resolve_data_root

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


sys.path.insert(0, str(REPO / "bench"))
from simulation_peers import FRAMEWORKS, INSTALL  # noqa: E402

CLIENTS = 200  # --quick's setting (all per round, 2 rounds) at 200 clients: at 1,000 the five rows took 594 s of CI
# every runner but fedsim's hosted layout on the messages backend, whose replies equal the batched
# backend's (tests/test_row_batches.py): its run was 80-190 s of CI's longest test
ROWS = [name for name in FRAMEWORKS if name != "fedsim, 2 SuperNodes"]
NO_DEPS = {
    "pfl": "pfl==0.6.0",
    "flgo": "flgo==0.4.4",
}  # the peers pip cannot resolve beside fedsim (INSTALL)


@pytest.fixture(scope="module")
def peers(tmp_path_factory) -> dict:
    """The environment of the quick run: each of pfl and FLGo that is not installed goes into a
    folder of this test's own with ``--no-deps`` (their dependencies are the ``bench`` extra's,
    part of the test extra), on PYTHONPATH, so that every runner is exercised, not only the
    installed ones. An index that cannot serve them skips the test, saying so."""
    missing = [
        spec for package, spec in NO_DEPS.items() if importlib.util.find_spec(package) is None
    ]
    env = {**os.environ, "HOME": str(tmp_path_factory.mktemp("home"))}
    if missing:
        target = tmp_path_factory.mktemp("peers-site")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                *missing,
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            pytest.skip(
                f"{missing} not installed and pip could not install them: {done.stderr[-300:]} ({INSTALL})"
            )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), env.get("PYTHONPATH", "")]))
    return env


def test_quick_mode_runs_every_framework_on_equal_work(tmp_path, peers):
    from omegaconf import OmegaConf

    from fedsim_tasks.topical_chat.turn_sentiment import Recipe

    out = tmp_path / "peers"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "simulation_peers.py"),
            "--clients",
            str(CLIENTS),
            "--per-round",
            "0",
            "--rounds",
            "2",
            "--out",
            str(out),
            "--frameworks",
            *ROWS,
        ],
        cwd=tmp_path,
        env=peers,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert [r["framework"] for r in rows] == ROWS
    assert not {r["framework"]: r["error"] for r in rows if "error" in r}
    assert all(r.get("replies_lost", 0) == 0 for r in rows), rows  # fedsim's: every reply taken
    assert all(
        r["clients"] == r["per_round"] == CLIENTS and r["s_per_round"] > 0 and r["peak_gb"] > 0
        for r in rows
    )
    task = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "task" / "turn_sentiment.yaml"))
    recipe = Recipe.of(task, str(resolve_data_root()))
    initial = recipe.evaluate(recipe.initial(seed=0))["loss"]
    losses = {r["framework"]: r["loss"] for r in rows}
    assert all(loss < initial for loss in losses.values()), (initial, losses)
    assert max(losses.values()) - min(losses.values()) < 1e-4, losses
    assert "| framework |" in proc.stdout and "goal <= 1.1x" in proc.stdout
