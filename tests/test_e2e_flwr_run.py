"""`flwr run .` as a Flower user runs it (Flower's own CLI, typed keys of [tool.flwr.app.config]),
against a private simulation SuperLink (Flower's `:local:` one has fixed ports shared by every
checkout on the machine, FLOWER_NOTES.md): a value of the wrong type is refused with fedsim's
message before the first message, an undeclared key by Flower with a non-zero exit, and a tiny run
on Flower's default 2-SuperNode federation says how the task's 20 clients sit on them."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import SMALL, private_tmpdir
from fedsim.config.data import REPO_ROOT, resolve_data_root
from fedsim.run.launcher import BIN, _env, start_superlink, write_connection
from fedsim.run.watchdog import run_processes

pytestmark = pytest.mark.e2e


@pytest.fixture
def flwr(tmp_path):
    """``flwr ARGS`` against a private SuperLink; every process of it is gone afterwards."""
    root = private_tmpdir()
    home = tmp_path / "flwr_home"
    home.mkdir()
    # the app runs from Flower's copy under FLWR_HOME: the data root is named, as docs/usage.md says
    env = {
        **_env(home, "flwr-run-test"),
        "TMPDIR": root,
        "FEDSIM_DATA_ROOT": str(resolve_data_root(None)),
    }
    link, port = start_superlink(tmp_path, env, simulation=True)
    write_connection(home, f"127.0.0.1:{port}", None)

    def run(*args, timeout=240):
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    try:
        yield run
    finally:
        link.stop()
        assert run_processes(root) == [], "processes left by the flwr run"
        shutil.rmtree(root, ignore_errors=True)


def status(flwr, output: str) -> str:
    run_id = output.split("Successfully started run ")[1].split()[0]
    return json.loads(flwr("ls", "--run-id", run_id, "--format", "json").stdout)["runs"][0][
        "status"
    ]


def test_flwr_run_refuses_bad_config_and_states_the_supernodes(flwr, tmp_path):
    undeclared = flwr("run", str(REPO_ROOT), "--stream", "--run-config", "num_round=3")
    assert (
        undeclared.returncode != 0
        and "Invalid run configuration" in undeclared.stdout + undeclared.stderr
    )

    wrong_type = flwr("run", str(REPO_ROOT), "--stream", "--run-config", "seed='x'")
    log = wrong_type.stdout + wrong_type.stderr
    assert (
        "configuration error, nothing was sent" in log
        and "could not be converted to Integer" in log
    ), log
    assert "clients done" not in log and status(flwr, log) == "finished:failed"
    assert (
        wrong_type.returncode == 0
    )  # Flower 1.42's CLI: a failed ServerApp is seen in `flwr ls`, not the exit

    out = tmp_path / "results"
    tiny = flwr(
        "run",
        str(REPO_ROOT),
        "--stream",
        "--run-config",
        f"seed=3 overrides='{' '.join(SMALL)} results_dir={out}'",
    )
    log = tiny.stdout + tiny.stderr
    assert (
        "2 SuperNodes connected for the task's 20 clients: each SuperNode hosts about 10" in log
    ), log
    assert status(flwr, log) == "finished:completed"
    assert json.loads((out / "results.json").read_text())["supernodes"] == 2
    assert "seed: 3" in (out / "config.yaml").read_text().splitlines()
    assert os.path.exists(Path(out) / ".hydra" / "overrides.yaml")
