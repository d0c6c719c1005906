"""`fedsim experiments`: each experiment's line of what it shows and its time on 2 CPU cores,
from the ``about`` block its own YAML states; every stated time is the one its record measured."""

import json
import statistics
from datetime import datetime

import pytest
from omegaconf import OmegaConf

from fedsim.config.compose import CONF_DIR, ConfigError, about, choices
from fedsim.config.data import REPO_ROOT
from fedsim.run import cli

EXPERIMENTS = choices("experiment")


def recorded_seconds(record: str) -> tuple[float, int]:
    """(wall seconds of one run, the machine's cores) from a kept record: a sweep's manifest
    gives the median of its completed runs, a single run's results.json its start to end."""
    data = json.loads((REPO_ROOT / record).read_text())
    if record.endswith("sweep.json"):
        done = [r["seconds"] for r in data["runs"] if r["status"] == "completed"]
        return statistics.median(done), data["provenance"]["machine"]["cores"]
    command = data["provenance"]["command"]
    span = datetime.fromisoformat(command["ended"]) - datetime.fromisoformat(command["started"])
    return span.total_seconds(), data["provenance"]["machine"]["cores"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_states_what_it_shows_and_a_time_its_record_measured(experiment):
    raw = OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml")
    assert "about" in raw, "each experiment states its own (an inherited one describes another)"
    stated = about(experiment)
    assert stated.shows and "\n" not in stated.shows and len(stated.shows) <= 140
    if stated.seconds is not None:
        seconds, cores = recorded_seconds(stated.measured)
        assert cores == 2 and abs(seconds - stated.seconds) < 1, (seconds, cores)


def test_a_time_without_where_it_was_measured_is_refused(tmp_path, monkeypatch):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "x.yaml").write_text(
        "about: {shows: a toy, seconds: 10, measured: null}\n"
    )
    monkeypatch.setattr("fedsim.config.compose.CONF_DIR", tmp_path)
    with pytest.raises(ConfigError, match="about.measured"):
        about("x")


def test_the_command_lists_every_experiment_with_its_line_and_time(capsys):
    assert cli.main(["experiments"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for experiment in EXPERIMENTS:
        (line,) = [line for line in lines if line.split(" ")[0] == experiment]
        stated = about(experiment)
        assert stated.shows in line
        assert ("[not measured]" in line) == (stated.seconds is None)
        if stated.seconds is not None:
            assert f"a run on 2 cores, measured: {stated.measured}]" in line
    assert "fedsim_schema" not in "".join(lines)
    assert any("fedtp_paper" in line and "[3 min a run on 2 cores" in line for line in lines)
