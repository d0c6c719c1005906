"""A deployment's hostile reply: one a client made unreadable to Flower (``faults.uninflatable``:
a declared shape Flower's ``Array.inflate`` refuses) is counted ``malformed``, and the honest
replies the ServerApp pulled in the same call are kept (``fedsim/runtime/reply_pull.py``; with
Flower's own pull the call raised, the SuperLink had already deleted every reply it returned, and
the run ended)."""

import pytest

from conftest import SMALL, fedsim_run, read_results

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_an_uninflatable_reply_costs_only_itself_in_a_deployment(tmp_path):
    out = tmp_path / "results"
    code, log = fedsim_run(
        *SMALL,
        "hardware=deploy_local",
        "hardware.num_supernodes=3",
        "faults.uninflatable=[0]",
        f"results_dir={out}",
        f"client_state.dir={tmp_path / 'state'}",
    )
    assert code == 0, log[-3000:]
    res = read_results(out)
    counts = res["faults"]["prior/train"]["1"]
    assert {k: counts[k] for k in ("sent", "failed", "malformed", "timed_out", "accepted")} == {
        "sent": 3,
        "failed": 0,
        "malformed": 1,
        "timed_out": 0,
        "accepted": 2,
    }
    assert "unreadable reply" in log
    # under SuperNode authentication (deploy_local's default) each partition is its node key's
    assert "[whoami] partitions bound to the SuperNodes' keys" in log and ", bound to " not in log
