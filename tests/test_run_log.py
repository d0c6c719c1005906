"""Quiet logs (issue 66): Flower's dump of a strategy's ConfigRecords and its stale warnings are
left out at ``logging.level=info`` (the default) and shown at ``debug``; every run keeps its log in
``results_dir/fedsim.log``, a sweep's point once (its output already goes there)."""

import io
import logging
import subprocess
import sys

import pytest
from flwr.app import ArrayRecord, ConfigRecord
from test_e2e_simulation import TINY

from conftest import fedsim_run
from fedsim.config.compose import REFUSED, compose_checked
from fedsim.flower.strategies import log_strategy_start_info
from fedsim.progress import Quiet
from fedsim.run.launcher import _Results, run_log

# lines of a real run's stream (fedsim run, 2026-12-02) that say nothing about the run
FLOWER_NOISE = [
    "\x1b[93mWARNING \x1b[0m:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    "\x1b[92mINFO \x1b[0m:      To change federation size, use the following command:",
    "\x1b[92mINFO \x1b[0m:      \tflwr federation simulation-config @none/default <superlink> --num-supernodes <N>",
    "/x/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of Ray, Ray will no longer",
    "  warnings.warn(",
    "\x1b[93mWARNING \x1b[0m:   fraction_evaluate is set to 0.0. Federated evaluation will be skipped.",
]
KEPT = ["INFO fedsim: results -> /tmp/out", "\x1b[92mINFO \x1b[0m:      [ROUND 1/3]"]


def flower_start_log(quiet: bool) -> str:
    """What Flower's own strategy start logs, through the ServerApp's filter or without it."""
    flower, text = logging.getLogger("flwr"), io.StringIO()
    handler = logging.StreamHandler(text)
    flower.addHandler(handler)
    quiet_filter = Quiet()
    if quiet:
        flower.addFilter(quiet_filter)
    try:
        config = ConfigRecord({"fedsim-task": '{"name": "' + "x" * 900 + '"}'})
        log_strategy_start_info(3, ArrayRecord(), config, config)
    finally:
        flower.removeHandler(handler)
        flower.removeFilter(quiet_filter)
    return text.getvalue()


def test_flowers_configrecord_dump_is_left_out_unless_debug():
    assert "ConfigRecord (train)" in flower_start_log(quiet=False)
    quiet = flower_start_log(quiet=True)
    assert "ConfigRecord" not in quiet and "Number of rounds: 3" in quiet


def test_the_streams_stale_lines_are_kept_in_the_log_not_shown():
    shown, log = [], io.StringIO()
    results = _Results(shown.append, [log], quiet=True)
    for line in FLOWER_NOISE + KEPT:
        results(line)
    assert shown == KEPT and log.getvalue().splitlines() == FLOWER_NOISE + KEPT
    shown.clear()
    debug = _Results(shown.append, [], quiet=False)
    for line in FLOWER_NOISE:
        debug(line)
    assert shown == FLOWER_NOISE


def test_a_wrong_log_level_is_refused_naming_the_key():
    with pytest.raises(REFUSED, match="logging.level"):
        compose_checked(["logging.level=verbose"])


def test_a_sweep_points_log_is_written_once(tmp_path):
    """A sweep's point runs with its output in its fedsim.log already: the launcher writes none."""
    log = tmp_path / "fedsim.log"
    probe = "from pathlib import Path; from fedsim.run.launcher import run_log; print(run_log(Path(r'%s')))"
    with open(log, "w") as out:
        subprocess.run([sys.executable, "-c", probe % tmp_path], stdout=out, check=True)
    assert log.read_text() == "None\n"
    (tmp_path / "single").mkdir()
    kept = run_log(tmp_path / "single")
    kept.write("line\n")
    kept.close()
    assert (tmp_path / "single" / "fedsim.log").read_text() == "line\n"


@pytest.mark.e2e
@pytest.mark.slow  # one run through Ray: 2 min on 2 loaded cores
def test_a_single_run_keeps_its_quiet_log(tmp_path):
    out = tmp_path / "results"
    code, log = fedsim_run(*TINY, f"results_dir={out}")
    assert code == 0, log[-3000:]
    kept = (out / "fedsim.log").read_text()
    assert "INFO fedsim: results ->" in kept and "Since flwr 1.32" in kept
    assert "Since flwr 1.32" not in log and "ConfigRecord (train)" not in log + kept
