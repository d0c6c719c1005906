"""The clock group refused before anything starts (exit 2, naming why): a trace file's bad row,
an asynchronous strategy without a clock or in a method whose rounds are synchronous, a clock
under a DP wrapper, a wrong clock key."""

import json

import pytest

from conftest import fedsim_refusal

TURNS = ["experiment=turn_sentiment_fedavg", "hardware.num_clients=4"]


def test_a_trace_with_a_bad_row_is_refused_naming_the_row(tmp_path):
    trace = tmp_path / "capacity.json"
    trace.write_text(
        json.dumps(
            {
                "1": {"computation": 10.0, "communication": 800.0},
                "2": {"computation": 10.0, "communication": 0},
            }
        )
    )
    code, err = fedsim_refusal(*TURNS, "clock=trace", f"clock.trace.device_capacity={trace}")
    assert code == 2 and f"{trace}: row '2': 'communication' must be > 0" in err, err


@pytest.mark.parametrize(
    "overrides, why",
    [
        (["strategy=fedbuff"], "strategy FedBuff is asynchronous: it runs on the virtual clock"),
        (
            ["experiment=feddtre_paper", "strategy=fedasync", "clock=synthetic"],
            "cannot run strategy FedAsync: FedDTRE's trust schedule",
        ),
        (
            ["experiment=fedtp", "clock=synthetic"],
            "clock=synthetic is refused for experiment fedtp",
        ),
        (
            ["experiment=fede4rag_paper", "clock=synthetic"],
            "clock=synthetic is refused for experiment fede4rag_paper: its methods are compared "
            "at one budget of optimizer steps",
        ),
        (["clock=synthetic", "privacy=dp_server_fixed"], "cannot run under privacy=dp"),
        (["clock=trace"], "No value for clock.trace.device_capacity"),
        (["clock=synthetic", "clock.over_selection=0.5"], "clock.over_selection must be >= 1"),
        (["clock=synthetic", "clock.synthetic.online_hours=30"], "online_hours must be in (0, 24]"),
        (["clock.deadlin=3"], "Did you mean: deadline"),
    ],
)
def test_a_clock_the_run_cannot_keep_is_refused(overrides, why):
    code, err = fedsim_refusal(*TURNS, *overrides)
    assert code == 2 and why in err, err
