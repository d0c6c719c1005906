"""A real SuperLink and two SuperNodes on loopback, over TLS with node authentication (a private
CA made for the run, each node registered), run a small FedTP experiment, then stop."""

import pytest

from conftest import read_results
from fedsim import exchange_trace

pytestmark = pytest.mark.e2e


def test_fedtp_through_superlink_and_two_supernodes(run_small, tmp_path, monkeypatch):
    monkeypatch.setenv(exchange_trace.TRACE_ENV, str(tmp_path))
    code, log, out = run_small("hardware=deploy_local", "task.max_per_split=2")
    assert code == 0, log
    assert "deployment via SuperLink 127.0.0.1:" in log and "(TLS + node authentication)" in log
    res = read_results(out)
    assert res["supernodes"] == 2 and res["conversations"] == 8
    # each SuperNode hosts 2 validation conversations: 4 client vectors in the prior
    assert res["prior_clients"]["count"] == 4 and res["prior_clients"]["nodes"] == 2
    assert res["routers"]["fedmix"]["overall"]["turns"] > 0
    # SuperLink and SuperNodes were stopped: run_small checks that no process of the run is left
    # (by its private work folder; a machine-wide count also saw other runs' SuperLinks)
    # every message had a ClientApp process of its own, forked from its SuperNode's warm process
    marks = exchange_trace.read(tmp_path)
    handled = [m for m in marks if m["event"] == "enter"]
    parents = {m["pid"]: m["parent"] for m in marks if m["event"] == "process-start"}
    assert len({m["pid"] for m in handled}) == len(handled) >= 8  # discover, prior, tune, test x 2 nodes
    assert all("multiprocessing.forkserver" in parents[m["pid"]] for m in handled), set(parents.values())
    assert {phase for phase, _ in exchange_trace.breakdown(marks)} >= {"discover", "prior/train", "tune", "test"}
