"""Static checks in the test command: the one-way layers (import-linter contracts in
pyproject.toml) and ruff."""

import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_layers_import_one_way():
    res = _run(str(BIN / "lint-imports"), "--no-cache")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


def test_ruff():
    res = _run(str(BIN / "ruff"), "check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_tests_run_in_a_private_home():
    home = Path.home()  # set by the repository's root conftest.py
    assert home.name.startswith("fedsim-test-home-")
    assert Path("~/.cache").expanduser().is_relative_to(home)
