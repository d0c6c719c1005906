"""``bench/fedbiscuit_hacking_curves.py`` counts the runs ``fedsim compare`` counts: a run that
wrote its results and then failed (``error.txt``) is not a seed of the curves."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(folder: Path, seed: int, proxy: float, failed: bool = False) -> None:
    folder.mkdir(parents=True)
    (folder / "point.json").write_text(json.dumps({"overrides": [f"seed={seed}"]}))
    curve = [
        {
            "steps": 60,
            "proxy_win_rate": proxy,
            "judge_win_rate": 0.5,
            "gap": proxy - 0.5,
            "reply_words": 9.0,
        }
    ]
    (folder / "results.json").write_text(
        json.dumps({"rlhf": {"reward_hacking": {"fedbis": curve}}})
    )
    if failed:
        (folder / "error.txt").write_text("privacy audit: the reported epsilon does not hold")


def test_a_failed_run_is_not_a_seed_of_the_curves(tmp_path):
    _run(tmp_path / "sweep" / "seed-1", 1, 0.7)
    _run(tmp_path / "sweep" / "seed-2", 2, 0.9)
    _run(tmp_path / "sweep" / "seed-3", 3, 0.1, failed=True)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "fedbiscuit_hacking_curves.py"),
            str(tmp_path / "sweep"),
            "--into",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row = next(line for line in out.splitlines() if line.startswith("| fedbis"))
    assert row.startswith(
        "| fedbis | 60 | 2 | 0.800"
    )  # seeds 1 and 2 only; with seed 3 the mean is 0.567
    assert (tmp_path / "reward_hacking_over_seeds.png").exists()
