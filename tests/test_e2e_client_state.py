"""Client state across rounds (``fedsim/runtime/client_state.py``) and resume in real runs: 3 rounds of
the stateful test client ``fedsim_clients/state_probe.py`` under FedTP's aggregation, 4 logical
clients, in each layout: one SuperNode per client (Ray), two clients per SuperNode (sharded,
Ray), and a real SuperLink with two SuperNode processes of two clients each
(``hardware=deploy_local``, TLS + node authentication; ``client_state.dir`` reaches its
SuperNodes as their node config ``state-dir``). In each: every client's round t read what it
saved in round t-1, in its own folder under ``client_state.dir``; no state array reaches the
server (results, journal, replies); and the clients end with the same states and the server
with the same release in every layout.

Resume, in each layout: ``fedsim run`` stopped by SIGTERM or SIGKILL (deploy_local: SIGINT too)
while client 3 holds its round-2 reply (``FEDSIM_STATE_PROBE_HOLD``: it saved round 2, the
server journaled round 1 only; the test releases it after the stop, so no timing decides the
kill point), then ``fedsim run resume=``, ends with the client states and results of the
layout's uninterrupted run. SIGINT is the same launcher code as SIGTERM (one handler, another
exit code: ``tests/test_launcher_signals.py``), so it runs in one layout only. deploy_local is
also stopped before its ServerApp began (no ``run.key`` yet) and resumed. Last, in process: a
fresh run in a results folder whose earlier run kept its client state does not read it, and a
resume of a run whose journal never began starts from the beginning.

Times on the 2-core machine, nothing else running: an uninterrupted run ~35 s (one per node),
~30 s (sharded), ~55 s (deploy_local); a stop and resume ~60-90 s; in process ~1 s each."""

import signal
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from test_sharded_grid import supernodes

from conftest import (
    cmdline,
    fedsim_run,
    journaled,
    kill_when,
    private_tmpdir,
    read_results,
    without_timings,
)
from fedsim.config.compose import compose
from fedsim.config.node_local import from_run
from fedsim.flower.messages import ProtoMessage, message_from_proto
from fedsim.results.outputs import RunOutput
from fedsim.run.watchdog import run_processes
from fedsim.runtime import server_app
from fedsim_clients.state_probe import HOLD_ENV, NAME, secret

CLIENTS, ROUNDS = 4, 3
RUN = [
    "experiment=fedtp_aggregate",
    "task.client=fedsim_clients.state_probe.StateProbeClient",
    f"hardware.num_clients={CLIENTS}",
    "strategy.noise_multiplier=0",
    f"num_rounds={ROUNDS}",
    "client_state.keep=true",
    "checkpoint.keep=true",
]  # the tests read the journal after the run
LAYOUTS = {
    "one_per_node": [],
    "sharded": ["hardware.clients_per_supernode=2"],
    "deploy_local": ["hardware=deploy_local", "hardware.clients_per_supernode=2"],
}
HELD = 3  # the client that holds its round-2 reply in the resume tests


def _run(folder: Path, *extra: str) -> Path:
    """A run of RUN (and ``extra``) with its results and its client state under ``folder``."""
    code, log = fedsim_run(
        *RUN, *extra, f"results_dir={folder / 'results'}", f"client_state.dir={folder / 'state'}"
    )
    assert code == 0, log[-3000:]
    assert f"[forget] {CLIENTS}/{CLIENTS} replies" in log  # every client was told the run ended
    return folder


def _run_folder(folder: Path) -> Path:
    """The run's client-state folder, named by the key the ServerApp gave it (config.yaml)."""
    return (
        folder
        / "state"
        / f"run-{OmegaConf.load(folder / 'results' / 'config.yaml').client_state.run_key}"
    )


def _states(folder: Path, only: bool = True) -> dict[int, dict[int, dict[str, np.ndarray]]]:
    """partition -> round -> the value it saved, read from the run's folder under
    ``folder/state`` (``only``: the one there), a folder per client, the two newest versions
    in each."""
    run = _run_folder(folder)
    assert [p.name for p in (folder / "state").iterdir()] == [run.name] or not only
    assert sorted(p.name for p in run.iterdir()) == [f"client-{p}" for p in range(CLIENTS)]
    states = {}
    for p in range(CLIENTS):
        files = sorted((run / f"client-{p}").iterdir())
        assert [f.name for f in files] == [f"{NAME}.r{r}.npz" for r in (ROUNDS - 1, ROUNDS)]
        states[p] = {}
        for f, r in zip(files, (ROUNDS - 1, ROUNDS)):
            with np.load(f, allow_pickle=False) as data:
                states[p][r] = {k: data[k] for k in data.files}
    return states


def _check_run(folder: Path, only: bool = True) -> dict:
    """Each client's state chains its own rounds; none of it reached the server. The states."""
    states = _states(folder, only)
    sent = []
    for p, by_round in states.items():
        for r, value in by_round.items():
            assert value["rounds"].tolist() == list(range(1, r + 1))  # round t read round t-1's
            assert value["partition"].tolist() == [p] and np.array_equal(value["secret"], secret(p))
        # round 3's value mixes the client's own round-2 value with the release every client got
        sent.append(2 * by_round[ROUNDS]["w"] - by_round[ROUNDS - 1]["w"])
    for g in sent:
        np.testing.assert_allclose(g, sent[0], rtol=0, atol=1e-12)
    assert sent[0].min() >= -1e-12 and sent[0].sum() == pytest.approx(1.0)
    assert len({states[p][ROUNDS]["w"].tobytes() for p in states}) == CLIENTS  # nothing shared
    _check_server_holds_no_state(folder / "results", states)
    return states


def _check_server_holds_no_state(results: Path, states: dict) -> None:
    """No state array's bytes in any file of the results folder or in any reply the server
    journaled, and each train reply holds only the protocol's record: the client's row."""
    leaks = [
        v[k].tobytes()
        for by_round in states.values()
        for v in by_round.values()
        for k in ("w", "secret")
    ]
    kept = [p for p in results.rglob("*") if p.is_file()]
    assert not [p for p in kept if p.suffix == ".npz" or "client-" in str(p.relative_to(results))]
    entries = journaled(results)
    assert [(e["phase"], e["round"]) for e in entries] == [
        ("aggregate/train", r) for r in range(1, ROUNDS + 1)
    ]
    replies = [b for e in entries for b in e["replies"]]
    for blob in [p.read_bytes() for p in kept] + replies:
        assert not any(leak in blob for leak in leaks)
        assert not any(s.tobytes().hex().encode() in blob for s in map(secret, range(CLIENTS)))
    for blob in replies:
        content = message_from_proto(ProtoMessage.FromString(blob)).content
        assert {name: sorted(record) for name, record in content.items()} == {
            "arrays": ["vectors"],
            "metrics": ["num-examples"],
        }
        assert content["arrays"]["vectors"].numpy().shape == (1, states[0][ROUNDS]["w"].shape[1])


def _same_states(got: dict, want: dict) -> None:
    for p in want:
        for r in want[p]:
            for k in want[p][r]:
                np.testing.assert_array_equal(
                    got[p][r][k], want[p][r][k], err_msg=f"client {p} round {r} {k}"
                )


@pytest.mark.e2e
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(name, marks=() if name == "one_per_node" else pytest.mark.exhaustive)
        for name in LAYOUTS
    ],
)
def test_state_chains_per_client_and_stays_on_the_client(uninterrupted, layout):
    folder = uninterrupted(layout)
    states = _check_run(folder)
    res = read_results(folder / "results")
    if layout == "one_per_node":
        assert (res["clients"], res["supernodes"]) == (CLIENTS, CLIENTS)
        return
    reference = uninterrupted("one_per_node")
    _same_states(states, _states(reference))
    assert (res["clients"], res["supernodes"]) == (CLIENTS, 2)
    np.testing.assert_allclose(
        res["released"], read_results(reference / "results")["released"], rtol=0, atol=1e-12
    )


def _resumed_as_uninterrupted(tmp_path: Path, reference: Path, replayed: int, said: str) -> None:
    """``fedsim run resume=`` of the run in ``tmp_path`` says ``said`` and ends as ``reference``:
    the same client states, in the same folder, and the same results."""
    out = tmp_path / "results"
    code, log = fedsim_run(f"resume={out}")
    assert code == 0, log[-3000:]
    assert said in log
    _same_states(_check_run(tmp_path), _states(reference))
    resumed, expected = read_results(out), read_results(reference / "results")
    assert resumed["checkpoint"] == {"exchanges": ROUNDS, "replayed": replayed}
    assert without_timings(resumed) == without_timings(expected)
    assert resumed["released"] == expected["released"] and resumed["faults"] == expected["faults"]


# The default suite stops the simulation by SIGKILL; every other layout x signal, deploy_local's among
# them, is exhaustive (pytest -m exhaustive): CI's 30 minutes.
STOPS = [
    pytest.param(
        layout, sig, id=f"{layout}-{sig.name}", marks=() if default else pytest.mark.exhaustive
    )
    for layout, sig, default in [
        ("one_per_node", signal.SIGTERM, False),
        ("one_per_node", signal.SIGKILL, True),
        ("sharded", signal.SIGTERM, False),
        ("sharded", signal.SIGKILL, False),
        ("deploy_local", signal.SIGTERM, False),
        ("deploy_local", signal.SIGINT, False),
        ("deploy_local", signal.SIGKILL, False),
    ]
]


@pytest.mark.e2e
@pytest.mark.parametrize("layout,sig", STOPS)
def test_stopped_after_clients_saved_an_unjournaled_round_then_resumed(
    uninterrupted, tmp_path, monkeypatch, layout, sig
):
    """Stopped while client 3 held its round-2 reply (every client it shares nothing with had
    saved round 2) and the server had journaled round 1 only: nothing more is journaled while
    the run stops (the ServerApp is ended first: its clients dying would otherwise be journaled
    as failures of round 2), the resumed run sends round 2 again, each client re-does it from its
    round-1 value (not from the round-2 value it saved), and the run ends as the uninterrupted
    one: the same client states, the same results."""
    out, state, release = tmp_path / "results", tmp_path / "state", tmp_path / "release"
    journal = out / "checkpoint" / "journal"
    monkeypatch.setenv(HOLD_ENV, f"{HELD}:2:{release}")

    def saved() -> bool:  # client 0 and the held client saved round 2
        return all(any(state.glob(f"run-*/client-{p}/{NAME}.r2.npz")) for p in (0, HELD))

    kill_when(
        [*RUN, *LAYOUTS[layout], f"results_dir={out}", f"client_state.dir={state}"],
        private_tmpdir(),
        lambda: saved() and len(list(journal.glob("*.exchange"))) >= 1,
        sig,
    )
    assert (
        len(list(journal.glob("*.exchange"))) == 1
        and saved()
        and not (out / "results.json").exists()
    )
    key = OmegaConf.load(out / "config.yaml").client_state.run_key
    release.touch()
    _resumed_as_uninterrupted(
        tmp_path, uninterrupted(layout), 1, "resume: replaying 1 journaled exchanges"
    )
    assert OmegaConf.load(out / "config.yaml").client_state.run_key == key  # the same folder


@pytest.mark.e2e
@pytest.mark.exhaustive  # its rule runs by default in process: test_a_run_whose_journal_never_began_...
def test_deploy_local_stopped_before_its_server_app_began_then_resumed(uninterrupted, tmp_path):
    """SIGTERM while the SuperLink is up and the ServerApp has not begun: no ``run.key``, no
    journal. The resume starts the run from its beginning (under a new secret: nothing was sent
    under the first) and ends as the uninterrupted run."""
    out = tmp_path / "results"
    root = private_tmpdir()

    def superlink_up() -> bool:
        return any(b"flower-superlink" in cmdline(pid) for pid in run_processes(root))

    kill_when(
        [
            *RUN,
            *LAYOUTS["deploy_local"],
            f"results_dir={out}",
            f"client_state.dir={tmp_path / 'state'}",
        ],
        root,
        superlink_up,
        signal.SIGTERM,
    )
    assert (out / "checkpoint" / "run.json").is_file() and not (
        out / "checkpoint" / "run.key"
    ).exists()
    _resumed_as_uninterrupted(
        tmp_path, uninterrupted("deploy_local"), 0, "resume: the killed run had journaled nothing"
    )


def _in_process(folder: Path, *extra: str) -> Path:
    """RUN through the ServerApp's code in this process, each client served by the real
    ClientApp handler (no Flower process: seconds, not a layout)."""
    cfg = compose(
        [*RUN, f"results_dir={folder / 'results'}", f"client_state.dir={folder / 'state'}", *extra]
    )
    server_app._run(supernodes(CLIENTS, node=from_run(cfg)), cfg, RunOutput(cfg.results_dir))
    return folder


def test_a_fresh_run_in_a_used_folder_starts_from_no_client_state(tmp_path):
    """An earlier run in the same results folder kept its client state (``client_state.keep``,
    or it was killed or failed); a fresh run there (not ``resume=``) must not read it. Both used
    to be keyed by the folder's hash: the fresh run's round-1 value was pruned as older than
    the earlier run's rounds 2 and 3, and its round 2 started over."""
    first = _check_run(_in_process(tmp_path))
    key = _run_folder(tmp_path).name
    _same_states(_check_run(_in_process(tmp_path), only=False), first)
    assert (
        _run_folder(tmp_path).name != key and (tmp_path / "state" / key).is_dir()
    )  # kept, not read


def test_a_run_whose_journal_never_began_resumes_from_its_beginning(tmp_path):
    """Stopped before its ServerApp wrote ``checkpoint/run.key`` (``fedsim run`` had written
    ``run.json``; a deployment's start takes seconds): the resume used to fail on the missing
    key. It starts the run from its beginning and ends as an uninterrupted run."""
    reference = _check_run(_in_process(tmp_path / "whole"))
    (tmp_path / "cut" / "results" / "checkpoint").mkdir(parents=True, mode=0o700)
    _same_states(_check_run(_in_process(tmp_path / "cut", "resume=true")), reference)
    assert read_results(tmp_path / "cut" / "results")["checkpoint"] == {
        "exchanges": ROUNDS,
        "replayed": 0,
    }
