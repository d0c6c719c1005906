"""End-to-end `fedsim run` through Flower's Ray simulation on a real 20-conversation slice."""

import os
import platform
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from conftest import SMALL, fedsim_run, read_results
from fedsim.config.data import REPO_ROOT
from fedsim.results import provenance

pytestmark = pytest.mark.e2e

ROUTER_KEYS = {"tfidf", "global", "local", "fedmix"}
TINY = [
    "experiment=fedtp_aggregate",
    "task.client=fedsim_clients.state_probe.StateProbeClient",
    "hardware.num_clients=2",
    "strategy.noise_multiplier=0",
    "num_rounds=1",
]  # the quickest run through Ray


def test_fedtp_small_slice_end_to_end(run_small):
    code, log, out = run_small()
    assert code == 0, log
    res = read_results(out)
    assert set(res["routers"]) == ROUTER_KEYS
    for router in ROUTER_KEYS:
        assert set(res["routers"][router]) == {"test_freq", "test_rare", "overall"}
        overall = res["routers"][router]["overall"]
        assert (
            overall["turns"]
            == sum(res["routers"][router][s]["turns"] for s in ("test_freq", "test_rare"))
            > 0
        )
        assert 0 <= overall["ehr"] <= 1 and 0 <= overall["support_ratio"] <= 1
    assert [r["lambda"] for r in res["lambda_sweep"]] == [0.0, 0.005, 0.01, 0.02, 0.05]
    assert res["lambda"] in [r["lambda"] for r in res["lambda_sweep"]]
    assert [r["sigma"] for r in res["dp_sweep"]] == [0.0, 1.0, 4.0]
    assert res["dp_sweep"][0]["epsilon"] is None  # sigma = 0: no privacy
    assert res["dp_sweep"][1]["epsilon"] > res["dp_sweep"][2]["epsilon"] > 0
    assert res["prior_clients"] == {
        "splits": ["valid_freq", "valid_rare"],
        "count": 10,
        "nodes": 10,
    }
    assert res["supernodes"] == 20 and res["conversations"] == 20
    lo, hi = res["bootstrap_ci_ehr_gain"]
    assert lo <= res["ehr_gain"] <= hi
    clusters = res["per_conversation_gain"]["groups"]  # the test conversations with a scored turn
    assert (
        res["bootstrap_ci_ehr_gain_unit"] == {"unit": "conversation", "clusters": clusters}
        and clusters >= 2
    )
    assert res["changed_decisions"]["turns"] == res["routers"]["fedmix"]["overall"]["turns"]
    assert res["faults"]["prior/train"]["1"] == {
        "sent": 10,
        "failed": 0,
        "malformed": 0,
        "timed_out": 0,
        "accepted": 10,
        "examples": 10,
    }
    for name in ("config.yaml", "summary.md", "ehr_vs_epsilon.png", "gain_histogram.png"):
        assert (out / name).stat().st_size > 0
    assert "Routers on test" in (out / "summary.md").read_text()
    assert f"over {clusters} conversations" in (out / "summary.md").read_text()
    assert (
        "clients done [" in log or "replies in" in log
    )  # progress output (a plain line off a terminal)
    _check_provenance(res["provenance"], out)
    _check_hydra_record(out)


def _check_hydra_record(out) -> None:
    """Hydra's record of the run where a Hydra user looks: the overrides the ServerApp composed
    (the user's and those fedsim run pinned), the same config, Hydra's own node."""
    overrides = OmegaConf.load(out / ".hydra" / "overrides.yaml")
    assert "task.max_per_split=5" in overrides and f"results_dir={out}" in overrides
    assert (out / ".hydra" / "config.yaml").read_text() == (out / "config.yaml").read_text()
    hydra = OmegaConf.load(out / ".hydra" / "hydra.yaml").hydra
    assert (
        list(hydra.overrides.task) == list(overrides)
        and hydra.runtime.choices.experiment == "fedtp"
    )


def _check_provenance(prov: dict, out) -> None:
    """Every field present and true: the checkout's commit and state, this venv's packages,
    this machine, the command as run, and times in order."""

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True
        ).stdout.strip()

    assert prov["git"] == {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain")),
    }
    assert prov["packages"] == provenance.packages() and prov["packages"]["flwr"] == "1.42.0"
    assert prov["machine"]["cores"] == os.cpu_count() and prov["machine"]["host"] == platform.node()
    assert prov["machine"]["cpu_model"] == provenance.machine()["cpu_model"]
    assert prov["command"]["line"] == shlex.join(["fedsim", "run", *SMALL, f"results_dir={out}"])
    assert (
        f"results_dir={out}" in prov["command"]["overrides"]
        and prov["command"]["cwd"] == os.getcwd()
    )
    command = prov["command"]
    assert (
        command["started"] <= prov["started"] <= prov["ended"] <= command["ended"]
    )  # ISO UTC sorts as time
    summary = (out / "summary.md").read_text()
    assert summary.count("## Provenance") == 1 and f"- commit {prov['git']['commit']}" in summary


@pytest.mark.exhaustive  # 150 s (a 60 s round timeout); each fault is refused in process by tests/test_reply_attacks.py
def test_faulty_clients_are_left_out_and_counted(run_small):
    # round_timeout need only be shorter than the injected sleep; at 20 s the discovery of 20 cold
    # ClientApps outlasted it on a busy machine
    code, log, out = run_small(
        "faults.crash=[0]",
        "faults.nan=[1]",
        "faults.wrong_length=[2]",
        "faults.negative=[3]",
        "faults.timeout=[4]",
        "faults.uninflatable=[5]",
        "faults.timeout_seconds=100",
        "round_timeout=60",
    )
    assert code == 0, log
    res = read_results(out)
    assert res["faults"]["prior/train"]["1"] == {
        "sent": 10,
        "failed": 1,
        "malformed": 4,
        "timed_out": 1,
        "accepted": 4,
        "examples": 4,
    }
    assert res["prior_clients"]["count"] == 4
    assert "injected crash" in log and "non-finite" in log and "negative mass" in log
    assert "declares" in log  # the array whose declared shape its bytes do not have


@pytest.mark.exhaustive  # FedAvg in FedTP's slot runs by default in process (tests/test_strategy_matrix.py)
def test_fedavg_strategy_swap_also_rejects_malformed_vectors(run_small):
    code, log, out = run_small("strategy=fedavg", "faults.nan=[1]")
    assert code == 0, log
    res = read_results(out)
    assert res["strategy"] == "flwr.serverapp.strategy.FedAvg"
    assert res["faults"]["prior/train"]["1"]["malformed"] == 1
    assert res["prior_clients"]["count"] == 9
    assert res["dp_sweep"] == []  # FedAvg releases no DP mean to sweep


@pytest.mark.exhaustive  # 52 s; by default tests/test_e2e_privacy_audit.py's failing audit takes the same path
def test_failed_run_exits_nonzero_with_the_error(run_small):
    # no SuperNode hosts a prior split: the ServerApp raises, Flower marks the run failed
    code, log, out = run_small("task.splits=[test_freq]", "task.prior_splits=[valid_freq]")
    assert code == 1, log
    assert "no SuperNode hosts a prior split" in log
    assert (out / "error.txt").exists() and not (out / "results.json").exists()


@pytest.mark.exhaustive  # 55 s; by default runs of two rounds play in process (tests/test_strategy_matrix.py)
def test_several_rounds_with_client_sampling(run_small):
    code, log, out = run_small(
        "num_rounds=3", "strategy.fraction_train=0.5", "protocol.dp_sigmas=[1.0]"
    )
    assert code == 0, log
    res = read_results(out)
    rounds = res["train_metrics"]
    assert sorted(rounds) == ["1", "2", "3"]
    # Poisson sampling at rate 0.5 of the 10 prior clients (what the accountant assumes): the count
    # varies per round; all 30 in three rounds has probability 2**-30
    assert (
        all(rounds[r]["clients"] <= 10 for r in rounds)
        and sum(rounds[r]["clients"] for r in rounds) < 30
    )
    eps = [rounds[r]["epsilon-rdp"] for r in ("1", "2", "3")]
    assert eps[0] < eps[1] < eps[2]  # composed by the RDP accountant
    assert res["dp_sweep"][0]["epsilon_rdp"] == eps[2]


def test_a_long_tmpdir_still_runs(tmp_path):
    """Ray's Unix sockets lie under its session folder, and a socket's path holds at most 107
    bytes: with Ray's session in the run's work folder under TMPDIR, a TMPDIR of more than about
    20 characters broke every simulation (issue 57). Ray's session is now reached by a short path."""
    out, links = tmp_path / "results", set(Path("/tmp").glob("fedsim-ray-*"))
    code, log = fedsim_run(*TINY, f"results_dir={out}", tmpdir="a" * 40)
    assert code == 0, log[-3000:]
    assert read_results(out)["faults"]["aggregate/train"]["1"]["accepted"] == 2
    assert set(Path("/tmp").glob("fedsim-ray-*")) == links  # the short path went with the run


def test_a_failed_run_keeps_its_processes_logs_in_its_results_and_names_them(tmp_path):
    """The logs of a run's processes lie in its work folder, which goes with the run: a failed
    run named its SuperLink's log there, and the log was gone (issue 57). They are now copied into
    the results folder, and the error names the copies."""
    out = tmp_path / "results"
    code, log = fedsim_run(
        *TINY, f"results_dir={out}", "faults.crash=[0,1]"
    )  # every client: the ServerApp raises
    assert code == 1, log[-3000:]
    [kept] = out.glob("logs-*")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700
    assert (
        f"the logs of the run's processes: {kept / 'serverapp.log'}, {kept / 'superlink.log'}"
        in log
    )
    assert "Starting Flower SuperExec" in (kept / "superlink.log").read_text()
    assert (
        "PhaseFailed: aggregate/train round 1" in (kept / "serverapp.log").read_text()
    )  # why it failed
