"""Checkpoint and resume: ``fedsim run`` killed with SIGKILL mid-run, then ``fedsim run
resume=<results_dir>``, ends with the results of an uninterrupted run of the same seed.

FedTP over 4 rounds of DPMean with client sampling and the RDP accountant (sigma 1): the run is
deterministic up to the order in which replies arrive (which changes float sums in the last bit,
as between two uninterrupted runs): the results must agree to 1e-12, timings aside; the DP
rounds (accountant, clients) and every fault count exactly. The two runs draw the same noise only
because they ask for it (``privacy.reproducible_noise``, public noise: the results say they are
not private); by default each run's noise is private. Every training reply is
delayed 1 s (an in-time ``timeout`` fault: the replies are accepted as usual) so the kill lands
mid-run."""

import json

import pytest

from conftest import (
    SMALL,
    fedsim_run,
    journaled,
    kill_when,
    private_tmpdir,
    read_results,
    without_timings,
)

pytestmark = pytest.mark.e2e

RUN = [
    *SMALL,
    "privacy.reproducible_noise=true",
    "num_rounds=4",
    "strategy.fraction_train=0.5",
    "protocol.dp_sigmas=[1.0]",
    "checkpoint.keep=true",  # the test reads the journal after the run
    "faults.timeout=[0,1,2,3,4,5,6,7,8,9]",
    "faults.timeout_seconds=1",
]


BATCHED = [  # the 20 clients on 2 SuperNodes, their replies stacked as rows
    "hardware.clients_per_supernode=10",
    "hardware.client_backend=batched",
]


def _kill_after(out, entries: int, root: str, layout: list[str]) -> None:
    """Start the run, SIGKILL ``fedsim run`` once ``entries`` exchanges are journaled."""
    journal = out / "checkpoint" / "journal"
    kill_when(
        [*RUN, *layout, f"results_dir={out}"],
        root,
        lambda: len(list(journal.glob("*.exchange"))) >= entries,
    )


@pytest.mark.exhaustive  # 170 s; by default tests/test_e2e_client_state.py resumes a SIGKILLed run to the same end
@pytest.mark.parametrize("layout", [[], BATCHED], ids=["one-client-per-supernode", "batched"])
def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, layout):
    whole = tmp_path / "whole"
    code, log = fedsim_run(*RUN, *layout, f"results_dir={whole}")
    assert code == 0, log[-3000:]
    phases = [(e["phase"], e["round"]) for e in journaled(whole)]
    kill_at = phases.index(("prior/train", 2)) + 1  # rounds 1 and 2 complete, 3 and 4 not
    cut = tmp_path / "cut"
    root = private_tmpdir()
    _kill_after(cut, kill_at, root, layout)
    assert not (cut / "results.json").exists()
    done = len(list((cut / "checkpoint" / "journal").glob("*.exchange")))
    assert kill_at <= done < len(phases)

    code, log = fedsim_run(f"resume={cut}")
    assert code == 0, log[-3000:]
    assert f"resume: replaying {done} journaled exchanges" in log
    resumed, reference = read_results(cut), read_results(whole)
    assert resumed["checkpoint"] == {"exchanges": len(phases), "replayed": done}
    assert without_timings(resumed) == without_timings(reference)
    assert resumed["train_metrics"] == reference["train_metrics"]  # DP rounds, epsilon: exact
    assert resumed["faults"] == reference["faults"]
    assert (
        resumed["privacy"]["private_noise"] is False
        and "NOT private" in resumed["privacy"]["warning"]
    )
    assert "NOT private" in (cut / "summary.md").read_text() and "NOT private" in log
    assert [(e["phase"], e["round"]) for e in journaled(cut)] == phases
    rows = (cut / "metrics.csv").read_text().splitlines()  # rewritten whole, nothing repeated
    assert len(rows) == len((whole / "metrics.csv").read_text().splitlines())


def test_resume_refuses_what_would_change_the_experiment(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoint").mkdir(parents=True)
    (out / "checkpoint" / "run.json").write_text(json.dumps({"overrides": [f"results_dir={out}"]}))
    code, log = fedsim_run(f"resume={out}", "protocol.dp_seeds=3")
    assert code == 2 and "'protocol.dp_seeds=3' would change the experiment" in log
    code, log = fedsim_run(f"resume={tmp_path / 'nothing'}")
    assert code == 2 and "no checkpointed run" in log
    (out / "results.json").write_text("{}")
    code, log = fedsim_run(f"resume={out}", "round_timeout=50")
    assert code == 2 and "completed; nothing to resume" in log
