"""Provenance: the commit and dirty flag of a real git checkout, the package versions and the
machine as the system reports them, and the stamp that joins fedsim run's part to the ServerApp's."""

import json
import os
import subprocess
from importlib import metadata

import psutil

from fedsim.results import provenance


def _git(root, *args) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "HOME": str(root),
    }
    return subprocess.run(
        ["git", "-C", str(root), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


def test_git_state_is_the_checkouts_commit_and_whether_it_differs(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "a")
    head = _git(tmp_path, "rev-parse", "HEAD").strip()
    assert provenance.git_state(tmp_path) == {"commit": head, "dirty": False}
    (tmp_path / "a.py").write_text("x = 2\n")  # a tracked change
    assert provenance.git_state(tmp_path) == {"commit": head, "dirty": True}
    _git(tmp_path, "checkout", "-q", "a.py")
    (tmp_path / "b.py").write_text("")  # an untracked file may change a result too
    assert provenance.git_state(tmp_path)["dirty"] is True
    assert provenance.git_state(tmp_path / "b.py") == {
        "commit": None,
        "dirty": None,
    }  # not a checkout


def test_packages_and_machine_are_what_the_system_reports():
    versions = provenance.packages()
    assert list(versions) == list(provenance.PACKAGES)
    assert versions["flwr"] == metadata.version("flwr") == "1.42.0" and versions[
        "fedsim"
    ] == metadata.version("fedsim")
    box = provenance.machine()
    assert box["cores"] == os.cpu_count() and box["memory_gib"] == round(
        psutil.virtual_memory().total / 2**30, 1
    )
    assert box["cpu_model"] and isinstance(box["gpus"], list)


def test_stamp_joins_the_launchers_part_and_ends_the_summary_with_one_section(tmp_path):
    server = {
        **provenance.environment(),
        "started": "2026-01-01T00:00:00+00:00",
        "ended": "2026-01-01T00:01:00+00:00",
    }
    (tmp_path / "results.json").write_text(json.dumps({"acc": 0.5, "provenance": server}))
    (tmp_path / "summary.md").write_text(f"# run\n\n{provenance.section(server)}\n")
    part = {
        "git": {"commit": "abc", "dirty": False},
        "command": provenance.command(["fedsim", "run", "seed=1"], []),
    }
    merged = provenance.stamp(tmp_path, part)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["acc"] == 0.5 and results["provenance"] == merged == {**server, **part}
    summary = (tmp_path / "summary.md").read_text()
    assert (
        summary.count(provenance.HEADING) == 1
        and "- commit abc" in summary
        and "`fedsim run seed=1`" in summary
    )
