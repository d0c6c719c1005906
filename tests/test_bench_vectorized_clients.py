"""``bench/vectorized_clients.py`` runs on the real turns and its two sides train the same
epochs (the bench would time different work if they did not)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from fedsim.config.data import resolve_data_root

ROOT = Path(__file__).resolve().parents[1]


def test_the_bench_times_the_loop_and_the_batched_epochs_of_the_same_clients():
    out = subprocess.run(
        [sys.executable, "bench/vectorized_clients.py", "--clients", "2000", "--hosted", "6"]
        + ["--repeats", "1"],
        cwd=ROOT,
        env={**os.environ, "FEDSIM_DATA_ROOT": str(resolve_data_root()), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["hosted"] == 6 and row["loop_s"] > 0 and row["batched_s"] > 0
    assert row["max_abs_difference"] < 1e-5
