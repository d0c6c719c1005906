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
os.environ["HF_HOME"] = str(PRIVATE_HOME / ".cache" / "huggingface")
os.environ["FEDSIM_STATE_DIR"] = str(PRIVATE_HOME / "client-state")  # fedsim/run/node_local.py


@pytest.fixture(scope="session", autouse=True)
def _private_home():
    yield PRIVATE_HOME
    shutil.rmtree(PRIVATE_HOME, ignore_errors=True)
