"""A real run on the virtual clock: turn-sentiment FedAvg over 20 clients with a deadline and
over-selection, through the ServerApp: results.json keeps every round's virtual start and end and
each sampled client's virtual finish, and the stragglers are counted in the round's faults."""

import pytest

from conftest import fedsim_run, read_results

pytestmark = pytest.mark.e2e


def test_a_run_on_the_clock_records_its_schedule(tmp_path):
    out = tmp_path / "run"
    code, log = fedsim_run(
        "experiment=turn_sentiment_fedavg",
        "hardware.num_clients=20",
        "protocol.clients_per_round=4",
        "num_rounds=2",
        "clock=synthetic",
        "clock.over_selection=1.5",
        f"results_dir={out}",
    )
    assert code == 0, log[-3000:]
    results = read_results(out)
    rounds = results["clock"]["rounds"]
    assert [(r["phase"], r["round"]) for r in rounds] == [("train/train", 1), ("train/train", 2)]
    assert (
        rounds[0]["virtual_start"] == 0.0 and rounds[1]["virtual_start"] >= rounds[0]["virtual_end"]
    )
    for r in rounds:
        assert r["quota"] == 4 and len(r["clients"]) == 6  # 4 x 1.5 sampled
        finished = [c["virtual_finish"] for c in r["clients"] if c["status"] == "accepted"]
        assert len(finished) == r["accepted"] and max(finished) <= r["virtual_end"]
        faults = results["faults"]["train/train"][str(r["round"])]
        assert (faults["stragglers"], faults["dropouts"]) == (r["stragglers"], r["dropouts"])
        assert faults["accepted"] == 6  # every sampled client trained and passed the checks
    assert [p["virtual_time"] for p in results["curve"]] == [0.0] + [
        r["virtual_end"] for r in rounds
    ]
    assert "## Virtual clock" in (out / "summary.md").read_text()
