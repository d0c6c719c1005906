"""Every test (and every `fedsim run` a test starts) sees a private, empty HOME: no test reads
or writes the user's ~/.cache (embedding cache, HE keys, Hugging Face, matplotlib), and a client
handler driven in process keeps its state there too, not in the machine's shared
<tmp>/fedsim-clients-<uid>."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

USER_HOME = Path.home()
PRIVATE_HOME = Path(tempfile.mkdtemp(prefix="fedsim-test-home-"))
os.environ["HOME"] = str(PRIVATE_HOME)
os.environ["XDG_CACHE_HOME"] = str(PRIVATE_HOME / ".cache")
os.environ["XDG_STATE_HOME"] = str(
    PRIVATE_HOME / ".local" / "state"
)  # the resume key (fedsim/privacy/secret.py)
os.environ["HF_HOME"] = str(PRIVATE_HOME / ".cache" / "huggingface")
os.environ["FEDSIM_STATE_DIR"] = str(PRIVATE_HOME / "client-state")  # fedsim/config/node_local.py


@pytest.fixture(scope="session", autouse=True)
def _private_home():
    yield PRIVATE_HOME
    shutil.rmtree(PRIVATE_HOME, ignore_errors=True)


SHARED_SESSION_RUN = {
    "test_e2e_client_state.py": "uninterrupted",
    "test_e2e_ray_cluster.py": "uninterrupted",
}


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup hook reads the marks
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`), a test file runs on one worker, so its module
    fixtures are built once; the files that compare with the session's ``uninterrupted`` run
    (tests/conftest.py) share a worker, so that run is made once."""
    for item in items:
        item.add_marker(
            pytest.mark.xdist_group(SHARED_SESSION_RUN.get(item.path.name, str(item.path)))
        )


@pytest.fixture
def victim_home(tmp_path, monkeypatch) -> Path:
    """A HOME of its own holding what a planted link aims at: an existing ``~/.bashrc`` and a
    ``~/.ssh/`` without ``authorized_keys`` yet."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".bashrc").write_text("# the user's own\n")
    monkeypatch.setenv("HOME", str(home))
    return home
