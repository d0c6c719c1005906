import json
import subprocess
import sys
from pathlib import Path

import pytest

FEDSIM = str(Path(sys.executable).parent / "fedsim")
SMALL = ["task.max_per_split=5", "protocol.dp_seeds=2", "protocol.bootstrap=200"]  # 20 conversations


def fedsim_run(*overrides, timeout=400):
    """Run the real console script; returns (exit code, combined output)."""
    proc = subprocess.run([FEDSIM, "run", *overrides], capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def read_results(path: Path) -> dict:
    return json.loads((path / "results.json").read_text())


@pytest.fixture
def run_small(tmp_path):
    def run(*overrides, timeout=400):
        out = tmp_path / "results"
        code, log = fedsim_run(*SMALL, f"results_dir={out}", *overrides, timeout=timeout)
        return code, log, out
    return run
