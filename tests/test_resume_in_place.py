"""A resume runs the killed run's saved overrides (any ``_target_``), so only a run this user
started in this very folder resumes: ``checkpoint/run.json`` is sealed under this user's resume
key, kept outside every results folder (``$XDG_STATE_HOME/fedsim``), and bound to the folder's
path and inode. A run folder copied from a shared sweep record (its author's run.json and key
with it), or this user's own run copied or moved elsewhere, never resumes."""

import json
import os
import re
import secrets
import shutil
import stat
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import (
    SMALL,
    Unpickled,
    fedsim_refusal,
    fedsim_run,
    private_tmpdir,
    stop_sweep_mid_point,
)
from fedsim.config.compose import ConfigError
from fedsim.privacy.secret import derive, seal
from fedsim.run.cli import RUN_FILE, _save_run, prepare, resumed
from fedsim.run.sweep import MANIFEST, Sweep


def planted_point(tmp_path, point, hardware=("hardware.num_clients=2",)):
    """A pending sweep point as fedsim before this check wrote it, shipped in a record: its
    author's ``checkpoint/run.json`` sealed under the ``checkpoint/resume.key`` beside it (0600
    and the reader's own once copied under umask 077), naming ``numpy.load`` on a pickle.
    Returns the file the pickle creates when it is loaded."""
    marker = tmp_path / "code-ran"
    weights = tmp_path / "weights.npy"
    np.save(weights, np.array([Unpickled(marker)], dtype=object), allow_pickle=True)
    overrides = [
        "experiment=turn_sentiment_fedavg",
        *hardware,
        "strategy._target_=numpy.load",
        *(
            f"~strategy.{k}"
            for k in (
                "fraction_train",
                "fraction_evaluate",
                "min_train_nodes",
                "min_available_nodes",
            )
        ),
        f"+strategy.file={weights}",
        "+strategy.allow_pickle=true",
        f"results_dir={point}",
    ]
    (point / "checkpoint").mkdir(parents=True, mode=0o700)
    key = secrets.token_bytes(32)
    fd = os.open(point / "checkpoint" / "resume.key", os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, key)
    os.close(fd)
    (point / RUN_FILE).write_bytes(
        seal(derive(key, b"run.json"), "run.json", {"overrides": overrides})
    )
    return marker


def save_run(folder):
    """``checkpoint/run.json`` as ``fedsim run`` writes it for a run in ``folder``."""
    cfg = SimpleNamespace(
        checkpoint=SimpleNamespace(enabled=True), resume=False, results_dir=str(folder)
    )
    _save_run(cfg, ["seed=3"])


def test_a_point_copied_from_a_record_does_not_run_its_authors_code(tmp_path):
    marker = planted_point(tmp_path, tmp_path / "record" / "seed-1")
    code, err = fedsim_refusal(f"resume={tmp_path / 'record' / 'seed-1'}")
    assert code == 2 and "was not written here by `fedsim run` for this user" in err, err
    assert not marker.exists()


def test_a_sweep_fails_a_planted_point_instead_of_resuming_it(tmp_path):
    """The sweep resumes a point holding a run.json (``fedsim run resume=<point>``): a point of a
    record run on, the user's own sweep resumed in place, both need the same refusal."""
    out = tmp_path / "sweep"
    sweep = Sweep(["seed=0", f"results_dir={out}"], prepare)
    # a remote deployment without its CA: refused after the strategy check, before any process starts
    marker = planted_point(
        tmp_path,
        out / sweep.manifest["runs"][0]["name"],
        hardware=(
            "hardware=deploy_remote",
            "hardware.superlink=x:9093",
            f"hardware.certificates={tmp_path / 'nope'}",
            "hardware.num_clients=2",
        ),
    )
    assert sweep.run() == 1
    error = json.loads((out / MANIFEST).read_text())["runs"][0]["error"]
    assert "was not written here by `fedsim run` for this user" in error, error
    assert not marker.exists()


def test_a_run_folder_of_another_user_does_not_resume(tmp_path, monkeypatch):
    """The author's own fedsim sealed the point; the reader's key is another."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "author"))
    save_run(tmp_path / "author-sweep" / "seed-1")
    shutil.copytree(tmp_path / "author-sweep", tmp_path / "record")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "reader"))
    with pytest.raises(ConfigError, match="not written here by `fedsim run` for this user"):
        resumed(str(tmp_path / "record" / "seed-1"), [])


def test_a_run_resumes_only_in_the_folder_it_was_started_in(tmp_path):
    run = tmp_path / "run"
    save_run(run)
    assert resumed(str(run), []) == ["seed=3", "resume=true"]
    shutil.copytree(run, tmp_path / "copy")
    with pytest.raises(ConfigError, match="not written here"):
        resumed(str(tmp_path / "copy"), [])
    run.rename(tmp_path / "moved")
    with pytest.raises(ConfigError, match="not written here"):
        resumed(str(tmp_path / "moved"), [])
    shutil.copytree(tmp_path / "moved", run)  # the same path, another folder
    with pytest.raises(ConfigError, match="not written here"):
        resumed(str(run), [])


def test_a_link_to_a_run_resumes_that_run_with_its_own_overrides_only(tmp_path):
    """A link someone else made (``resume=/tmp/shared/run`` naming this user's run folder) is
    resolved: it resumes this user's run as it was started, nothing of the link's author, and a
    link inside the folder to another run's run.json opens under no folder's key."""
    run, other = tmp_path / "run", tmp_path / "other"
    save_run(run)
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    assert resumed(str(tmp_path / "link"), []) == ["seed=3", "resume=true"]
    (other / "checkpoint").mkdir(parents=True)
    (other / RUN_FILE).symlink_to(run / RUN_FILE)
    with pytest.raises(ConfigError, match="not written here"):
        resumed(str(other), [])


def test_the_resume_key_is_this_users_outside_the_results_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    save_run(tmp_path / "run")
    assert sorted(
        p.relative_to(tmp_path / "run").as_posix() for p in (tmp_path / "run").rglob("*")
    ) == ["checkpoint", RUN_FILE.as_posix()]
    key = tmp_path / "state" / "fedsim" / "resume.key"
    assert (stat.S_IMODE(key.stat().st_mode), stat.S_IMODE(key.parent.stat().st_mode)) == (
        0o600,
        0o700,
    )
    save_run(tmp_path / "other")
    assert resumed(str(tmp_path / "run"), []) == resumed(
        str(tmp_path / "other"), []
    )  # one key, made once
    os.chmod(key.parent, 0o755)  # another user could swap the key
    with pytest.raises(ConfigError, match="mode 0700"):
        resumed(str(tmp_path / "run"), [])


def test_a_run_whose_resume_key_folder_is_open_to_others_is_refused_up_front(tmp_path, monkeypatch):
    """A fresh run seals its run.json under this user's key: a key folder others can enter (made
    by hand, or by another tool under another umask) is a configuration error naming the folder,
    exit 2 before anything starts, not a traceback."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "state" / "fedsim").mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "state" / "fedsim", 0o755)
    code, err = fedsim_refusal(
        "experiment=turn_sentiment_fedavg",
        "hardware.num_clients=2",
        f"results_dir={tmp_path / 'run'}",
    )
    assert code == 2 and f"checkpoint: {tmp_path / 'state' / 'fedsim'}: a private folder" in err, (
        err
    )
    assert not (tmp_path / "run" / RUN_FILE).exists()


def test_a_checkpoint_of_an_earlier_fedsim_is_refused_with_what_to_do(tmp_path):
    """An earlier fedsim kept run.json's key beside it, where a record carries it: its own
    checkpoints are refused too, saying how to run the point again."""
    point = tmp_path / "seed-1"
    planted_point(tmp_path, point)
    with pytest.raises(
        ConfigError, match=re.escape(f"remove {point / 'checkpoint'} to run it from its beginning")
    ):
        resumed(str(point), [])


@pytest.mark.e2e
@pytest.mark.exhaustive  # 3 minutes of Flower runs; the refusals above run by default
def test_a_sweep_stopped_mid_point_resumes_that_point_in_place(tmp_path):
    """The user's own sweep, stopped by SIGTERM while its first point works, then resumed: the
    point opens its run.json (in place, the user's key) and completes, and so does the rest."""
    root, out = private_tmpdir(), tmp_path / "sweep"
    sweep = [*SMALL, "seed=0,1"]
    try:
        stop_sweep_mid_point(sweep, out, root, tmp_path / "log.txt")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first = out / json.loads((out / MANIFEST).read_text())["runs"][0]["name"]
    assert (first / RUN_FILE).is_file()
    code, log = fedsim_run("-m", *sweep, f"resume={out}", timeout=600)
    assert code == 0, log
    assert [r["status"] for r in json.loads((out / MANIFEST).read_text())["runs"]] == [
        "completed",
        "completed",
    ]
    command = json.loads((first / "results.json").read_text())["provenance"]["command"]["line"]
    assert command == f"fedsim run resume={first}"  # resumed, not run again from scratch
