"""The run's secret: created 0600 at once, read back on resume, refused when others can read it;
the noise it keys is private, the public seed's is not (and says so)."""

import os
import stat
from concurrent.futures import ThreadPoolExecutor

import pytest

from fedsim.config.compose import compose
from fedsim.privacy.plan import noise_source
from fedsim.privacy.secret import derive, run_secret, user_secret


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


def test_a_users_secret_is_made_once_owner_only_outside_any_run(tmp_path, monkeypatch):
    """Eight first uses at once keep one key (each drafts its own, the first linked wins), and
    leave no draft behind."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: user_secret("resume.key"), range(8)))
    folder = tmp_path / "state" / "fedsim"
    assert len(keys) == 1 and [p.name for p in folder.iterdir()] == ["resume.key"]
    assert (
        stat.S_IMODE(folder.stat().st_mode),
        stat.S_IMODE((folder / "resume.key").stat().st_mode),
    ) == (0o700, 0o600)
    assert user_secret("resume.key") in keys and user_secret("other.key") not in keys
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", "state")  # not absolute: ignored, as the XDG spec says
    assert user_secret("resume.key") not in keys
    assert (tmp_path / "home" / ".local" / "state" / "fedsim" / "resume.key").is_file()
    os.chmod(folder, 0o755)  # another user could list it and swap the key
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with pytest.raises(PermissionError, match="mode 0700"):
        user_secret("resume.key")


def test_a_users_secret_under_a_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    """Whoever can write a folder above the key folder can rename it away and put in its place a
    folder of this user's holding a 32-byte 0600 key they know (a record's checkpoint folder as an
    earlier fedsim shipped it, copied under umask 077): every check on the folder and the key
    then holds, and run.json is sealed under the other user's key. Refused at the first use."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another local user may rename what is in it
    monkeypatch.setenv("XDG_STATE_HOME", str(shared / "state"))
    with pytest.raises(PermissionError, match=f"{shared} is writable by others"):
        user_secret("resume.key")
    assert not (shared / "state").exists()


def test_a_users_key_folder_that_is_a_link_or_another_users_is_refused(tmp_path, monkeypatch):
    """A link at ``$XDG_STATE_HOME/fedsim`` (to a folder of this user's holding a key someone
    knows) is not followed; a key folder another user made first is not used."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "state").mkdir()
    (tmp_path / "known").mkdir(mode=0o700)
    (tmp_path / "state" / "fedsim").symlink_to(tmp_path / "known", target_is_directory=True)
    with pytest.raises(PermissionError, match="must be a folder of this user"):
        user_secret("resume.key")
    if os.getuid() != 0:
        pytest.skip("making a folder another user's needs root")
    (tmp_path / "state" / "fedsim").unlink()
    (tmp_path / "state" / "fedsim").mkdir(mode=0o700)
    os.chown(tmp_path / "state" / "fedsim", 4242, 4242)
    with pytest.raises(PermissionError, match="belongs to uid 4242"):
        user_secret("resume.key")
