"""The launcher's work folder: as Ray reaches it (Ray's socket paths must fit in AF_UNIX's 107
bytes, whatever TMPDIR is), and what of it a failed run keeps (its processes' logs)."""

import shutil
import stat
from contextlib import ExitStack
from pathlib import Path

import pytest

from fedsim.run.launcher import (
    RAY_SOCKET_TAIL,
    SOCKET_PATH_MAX,
    Interrupted,
    RunFailed,
    keep_logs,
    ray_tmpdir,
)


def test_ray_reaches_a_deep_work_folder_by_a_short_private_path_gone_with_the_run(tmp_path):
    short, deep = (
        Path("/tmp/fedsim-run-abcdefgh"),
        tmp_path / ("a" * 100) / "w",
    )  # as tempfile names it
    deep.mkdir(parents=True)
    with ExitStack() as stack:
        assert ray_tmpdir(stack, short) == short  # it fits: Ray's session stays where it was
        link = ray_tmpdir(stack, deep)
        assert len(bytes(link)) + RAY_SOCKET_TAIL <= SOCKET_PATH_MAX
        assert link.resolve() == deep.resolve()  # the session still lies in the work folder
        assert stat.S_IMODE(link.parent.stat().st_mode) == 0o700
    assert not link.parent.exists()


def _launch(workdir: Path, results: Path, failure: Exception, secret: Path | None = None) -> None:
    """What :func:`~fedsim.run.launcher.launch` does on the way out of a run that raised ``failure``
    (with ``secret``, one of the work folder's logs is a link to it)."""
    workdir.mkdir()
    (workdir / "superlink.log").write_text("killed\n")
    if secret is not None:
        (workdir / "supernode-0.log").symlink_to(secret)
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir)
        stack.push(keep_logs(workdir, results))
        raise failure


def test_a_failure_naming_a_log_in_the_work_folder_names_its_kept_copy(tmp_path):
    """The sweep point that ended "flower-superlink exited with -9" named a log its exit removed."""
    workdir, results = tmp_path / "work", tmp_path / "results"
    results.mkdir()
    with pytest.raises(RunFailed) as failed:
        _launch(
            workdir,
            results,
            RunFailed(f"flower-superlink exited with -9; log: {workdir / 'superlink.log'}"),
        )
    [kept] = results.glob("logs-*")
    assert f"exited with -9; log: {kept / 'superlink.log'}\n" in str(failed.value)
    assert (kept / "superlink.log").read_text() == "killed\n" and not workdir.exists()


def test_an_interrupted_run_keeps_no_logs(tmp_path):
    (tmp_path / "results").mkdir()
    with pytest.raises(Interrupted):
        _launch(tmp_path / "work", tmp_path / "results", Interrupted(130))
    assert not list((tmp_path / "results").iterdir())


def test_a_log_that_is_a_link_is_not_followed_into_the_results(tmp_path):
    """Results travel (a sweep record is shared as files): a ``*.log`` link in the work folder
    to any file of this user's must not bring that file's bytes into ``logs-*``."""
    secret = tmp_path / "id_ed25519"
    secret.write_text("PRIVATE KEY\n")
    (tmp_path / "results").mkdir()
    with pytest.raises(RunFailed):
        _launch(
            tmp_path / "work",
            tmp_path / "results",
            RunFailed("flower-superlink exited with -9"),
            secret,
        )
    [kept] = (tmp_path / "results").glob("logs-*")
    assert sorted(p.name for p in kept.iterdir()) == ["superlink.log"]
