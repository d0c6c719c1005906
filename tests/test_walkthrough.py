"""docs/adding-a-method.md followed literally, in a copy of this checkout: the page's files are
written exactly as printed (each code block titled ``title="PATH"``) and the commands of its
``bash`` blocks run in order from the copy's root, as a reader runs them; then what the page says
they give is checked.

The default test starts no Flower run: it runs each ``fedsim run`` as ``fedsim run --cfg job`` of
the same arguments (composed and checked, nothing started; the page's own pytest step composes
every point of its sweep), and leaves out ``fedsim compare``, which needs the sweep's runs. The
``e2e`` test runs every command as printed (Flower, Ray) and checks the results.

The copy uses this checkout's venv (``.venv`` linked, as the page's ``.venv/bin/...`` expect)
with the copy first on ``PYTHONPATH``, so ``fedsim``, ``conf/`` and the new modules are the copy's;
it finds the data as a reader's clone does, at ``../shared/data`` (a link), which the repository's
own tests need; the toy task reads none, checked without the link. This checkout is never
modified.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from fedsim.config.data import ENV_VAR, REPO_ROOT, resolve_data_root

WALKTHROUGH = REPO_ROOT / "docs" / "adding-a-method.md"
BLOCK = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', re.S | re.M)
FEDSIM_RUN = re.compile(r"^(\.venv/bin/fedsim run) (-m )?")


def blocks() -> list[tuple[str, str | None, str]]:
    """(language, title, text) of the page's code blocks, in the page's order."""
    return BLOCK.findall(WALKTHROUGH.read_text())


def commands(text: str) -> list[str]:
    """The command lines of a bash block, a line continued with a backslash joined to the next."""
    return [line for line in text.replace("\\\n", " ").splitlines() if line.strip()]


def copy_of_checkout(tmp_path):
    """This checkout's files (tracked, and untracked ones git does not ignore), its venv, and
    the data beside it where a clone has it."""
    root = tmp_path / "repo"
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "data").symlink_to(resolve_data_root(None))
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listed.split("\0")):
        if (REPO_ROOT / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, root / name)
    (root / ".venv").symlink_to(REPO_ROOT / ".venv")
    return root


def run_in(root, command: str, exit_code: int = 0) -> subprocess.CompletedProcess:
    """``command`` in bash from ``root``, the copy first on the path, no data root set; it must
    exit with ``exit_code``."""
    env = {**{k: v for k, v in os.environ.items() if k != ENV_VAR}, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        ["bash", "-c", command], cwd=root, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == exit_code, (
        f"`{command}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def follow(root, start_runs: bool) -> dict[str, str]:
    """Every step of the page, in order, in ``root``; returns each command's output. Without
    ``start_runs``, a ``fedsim run`` is composed and checked (``--cfg job``) instead, and a
    sweep and ``fedsim compare`` are left to the page's pytest step and the e2e test."""
    outputs = {}
    for language, title, text in blocks():
        if title:
            assert not (root / title).exists(), f"the walkthrough would overwrite {title}"
            (root / title).parent.mkdir(parents=True, exist_ok=True)
            (root / title).write_text(text)
            continue
        for command in commands(text) if language == "bash" else []:
            run = command
            if not start_runs and (found := FEDSIM_RUN.match(command)):
                if found[2]:  # a sweep: the page's pytest step composes each of its points
                    continue
                run = command if "--cfg" in command else FEDSIM_RUN.sub(r"\1 --cfg job ", command)
            elif not start_runs and command.startswith(".venv/bin/fedsim compare"):
                continue
            outputs[command] = run_in(root, run).stdout
    return outputs


def test_the_page_names_every_layer_a_test_and_the_docs():
    assert {title for _, title, _ in blocks() if title} == {
        "fedsim_tasks/toy_numbers.py",
        "fedsim_clients/toy_mean_messages.py",
        "fedsim_clients/toy_mean.py",
        "fedsim_experiments/toy_mean/__init__.py",
        "fedsim_experiments/toy_mean/settings.py",
        "fedsim_experiments/toy_mean/protocol.py",
        "fedsim_experiments/toy_mean/report.py",
        "conf/task/toy_numbers.yaml",
        "conf/experiment/toy_mean.yaml",
        "tests/test_toy_mean.py",
        "docs/methods/toy_mean.md",
    }
    assert "/abs/" not in WALKTHROUGH.read_text()  # every command runs as printed


def test_the_page_followed_literally_passes_its_own_checks(tmp_path):
    root = copy_of_checkout(tmp_path)
    outputs = follow(root, start_runs=False)
    (tmp_path / "shared" / "data").unlink()  # the toy task reads no data: it needs no data root
    cfg_job = run_in(root, ".venv/bin/fedsim run --cfg job experiment=toy_mean").stdout
    assert "name: toy_mean" in cfg_job and "data_root: null" in cfg_job
    toy = run_in(root, ".venv/bin/python -m pytest -p no:cacheprovider -n 0 tests/test_toy_mean.py")
    assert re.search(r"\b2 passed\b", toy.stdout), toy.stdout[-3000:]  # no data root either
    # a method honours no strategy key it does not list: FedProx's term would act on nothing
    fedprox = "experiment=toy_mean strategy=fedprox strategy.proximal_mu=10"
    refused = run_in(root, f".venv/bin/fedsim run --cfg job {fedprox}", exit_code=2)
    assert "strategy.proximal_mu" in refused.stderr, refused.stderr
    (checks,) = [out for cmd, out in outputs.items() if "-m pytest" in cmd]
    # the page's pytest step: every check it names ran, none was skipped (the toy's commands exist)
    assert re.search(r"\b\d+ passed\b", checks) and "skipped" not in checks, checks[-3000:]
    table = (root / "docs" / "usage.md").read_text()
    assert re.search(r"^\| `task` \|.*`toy_numbers` \|", table, re.M)
    assert re.search(r"^\| `experiment` \|.*`toy_mean` \|", table, re.M)


@pytest.mark.e2e
@pytest.mark.exhaustive  # five Flower runs; the default suite follows the page without them
def test_the_page_followed_literally_with_its_runs(tmp_path):
    """Every command as printed: a run, a sweep of four runs and its comparison, through Flower
    and Ray; what the page says they give; nothing left running (each run's watchdog)."""
    root = copy_of_checkout(tmp_path)
    follow(root, start_runs=True)
    run = root / "outputs" / "toy_mean"
    results = json.loads((run / "results.json").read_text())
    assert abs(results["estimate"] - 1.5) < 0.15 and results["squared_error"] < 2.5
    assert {"faults", "communication"} <= set(results) and "estimate" in (
        run / "summary.md"
    ).read_text()
    assert not (run / "checkpoint").exists()  # a completed run's journal is removed
    sweep = root / "outputs" / "toy_sweep"
    assert len(list(sweep.glob("*/results.json"))) == 4
    assert all(
        (sweep / name).is_file()
        for name in ("summary.md", "comparison.json", "paired_differences.png", "metrics.png")
    )
    assert not list(sweep.glob("summary-*.md"))  # --force replaced the sweep's own comparison
