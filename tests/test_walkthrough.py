"""docs/adding-a-method.md does what it says: a copy of the repository with the walkthrough's
files written into it exactly as printed (each code block titled ``title="PATH"``)
composes its commands and runs its toy method end to end.

The copy runs in its own interpreter with the copy first on ``PYTHONPATH``, so ``fedsim``,
``conf/`` and the new modules are the copy's; this checkout is never modified.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import fedsim_run
from fedsim.data import REPO_ROOT, resolve_data_root

WALKTHROUGH = REPO_ROOT / "docs" / "adding-a-method.md"
FILE_BLOCK = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```', re.S | re.M)

# the in-process path of the walkthrough's step 7: the real ServerApp code over an InProcessGrid
# whose nodes call the real ClientApp handler
IN_PROCESS = """
import sys
from fedsim import server_app
from fedsim.cli import prepare
from fedsim.results import RunOutput
from test_sharded_grid import supernodes
cfg, _, clients, _ = prepare(sys.argv[1:])
server_app._run(supernodes(clients), cfg, RunOutput(cfg.results_dir))
"""


def walkthrough_files() -> dict[str, str]:
    return dict(FILE_BLOCK.findall(WALKTHROUGH.read_text()))


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """This checkout's files (tracked, and untracked ones git does not ignore) plus the
    walkthrough's."""
    root = tmp_path_factory.mktemp("walkthrough") / "repo"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO_ROOT / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, root / name)
    for path, text in walkthrough_files().items():
        assert not (root / path).exists(), f"the walkthrough would overwrite {path}"
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def copy_env(root) -> dict[str, str]:
    """The copy first on the path (its fedsim, conf/ and new modules win over this checkout's
    install) and this checkout's data root (the copy has no ../shared/data beside it)."""
    return {"PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")]),
            "FEDSIM_DATA_ROOT": str(resolve_data_root(None))}


def in_copy(root, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=root, env={**os.environ, **copy_env(root)},
                          capture_output=True, text=True, timeout=600)


def test_the_walkthrough_names_every_layer():
    assert set(walkthrough_files()) == {
        "fedsim_tasks/toy_numbers.py", "fedsim_clients/toy_mean_messages.py", "fedsim_clients/toy_mean.py",
        "fedsim_experiments/toy_mean.py", "conf/task/toy_numbers.yaml", "conf/experiment/toy_mean.yaml"}


def test_its_commands_compose_and_its_files_pass_the_lint_in_the_copy(copy):
    """The page's `fedsim run` commands, checked by the copy's own tests/test_docs.py (where
    the toy method exists, so they are not skipped), the copy's import layers and ruff, and its
    schemas holding no defaults: a reader who follows the page passes the repository's tests."""
    proc = in_copy(copy, ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_docs.py",
                          "tests/test_lint.py", "tests/test_configs.py", "-k",
                          "adding-a-method or layers or ruff or no_schema_field", "-o", "addopts="])
    assert proc.returncode == 0 and " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-3000:]


def test_the_toy_method_runs_in_process(copy, tmp_path):
    out = tmp_path / "toy"
    proc = in_copy(copy, ["-c", IN_PROCESS, "experiment=toy_mean", f"results_dir={out}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    # 4 clients centred on 0..3: FedAvg converges to their mean, 1.5, within sampling noise
    assert results["clients"] == 4 and abs(results["estimate"] - 1.5) < 0.15
    rounds = results["faults"]["fedavg/train"]
    assert len(rounds) == 3 and all(r["accepted"] == 4 for r in rounds.values())
    assert results["faults"]["evaluate"]["1"]["accepted"] == 4 and results["squared_error"] < 2.5


@pytest.mark.e2e
def test_the_toy_method_runs_through_flower(copy, tmp_path, monkeypatch):
    """`fedsim run experiment=toy_mean` as the walkthrough says: a private SuperLink, Ray, four
    SuperNodes; nothing left running when it exits (``fedsim_run`` checks)."""
    for name, value in copy_env(copy).items():
        monkeypatch.setenv(name, value)
    code, log = fedsim_run("experiment=toy_mean", f"results_dir={tmp_path / 'toy'}", timeout=600)
    assert code == 0, log[-3000:]
    assert abs(json.loads((tmp_path / "toy" / "results.json").read_text())["estimate"] - 1.5) < 0.15
