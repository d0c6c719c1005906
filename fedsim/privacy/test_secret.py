"""The run's secret: created 0600 at once, read back on resume, refused when others can read it;
the noise it keys is private, the public seed's is not (and says so)."""

import os
import stat

import pytest

from fedsim.privacy.secret import derive, run_secret
from fedsim.run.config import compose
from fedsim.runtime.server_app import noise_source


def test_secret_is_created_owner_only_and_read_back_on_resume(tmp_path):
    path = tmp_path / "checkpoint" / "run.key"
    secret = run_secret(path, resume=False)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert run_secret(path, resume=True) == secret
    assert run_secret(path, resume=False) != secret  # a new run in the same folder: a new one
    assert derive(secret, b"a") != derive(secret, b"b")


def test_a_key_file_others_can_read_or_a_symlink_is_refused(tmp_path):
    path = tmp_path / "run.key"
    run_secret(path, resume=False)
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError):
        run_secret(path, resume=True)
    link = tmp_path / "link.key"
    link.symlink_to(path)
    with pytest.raises(OSError):
        run_secret(link, resume=True)


def test_noise_is_private_unless_reproducible_noise_is_asked_for():
    secret = os.urandom(32)
    assert noise_source(compose([]), secret).private
    public = noise_source(compose(["privacy.reproducible_noise=true", "seed=7"]), secret)
    assert not public.private and public.entropy == 7
