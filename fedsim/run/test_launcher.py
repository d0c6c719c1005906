"""The launcher's work folder as Ray reaches it: Ray's socket paths must fit in AF_UNIX's 107
bytes, whatever TMPDIR is."""

import stat
from contextlib import ExitStack
from pathlib import Path

from fedsim.run.launcher import RAY_SOCKET_TAIL, SOCKET_PATH_MAX, ray_tmpdir


def test_ray_reaches_a_deep_work_folder_by_a_short_private_path_gone_with_the_run(tmp_path):
    short, deep = Path("/tmp/fedsim-run-abcdefgh"), tmp_path / ("a" * 100) / "w"  # as tempfile names it
    deep.mkdir(parents=True)
    with ExitStack() as stack:
        assert ray_tmpdir(stack, short) == short  # it fits: Ray's session stays where it was
        link = ray_tmpdir(stack, deep)
        assert len(bytes(link)) + RAY_SOCKET_TAIL <= SOCKET_PATH_MAX
        assert link.resolve() == deep.resolve()  # the session still lies in the work folder
        assert stat.S_IMODE(link.parent.stat().st_mode) == 0o700
    assert not link.parent.exists()
