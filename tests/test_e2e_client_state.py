"""Client state across rounds (``fedsim/client_state.py``) in real runs: 3 rounds of the
stateful test client ``fedsim_clients/state_probe.py`` under FedTP's aggregation, 4 logical clients,
in each layout: one SuperNode per client (Ray), two clients per SuperNode (sharded, Ray), and
a real SuperLink with two SuperNode processes of two clients each (``hardware=deploy_local``,
TLS + node authentication; its SuperNodes set no ``state-dir``, so the run's
``client_state.dir`` is the root). In each: every client's round t read what it saved in round
t-1, in its own folder under ``client_state.dir``; no state array reaches the server (results,
journal, replies); and the clients end with the same states and the server with the same
release in every layout. Then a run SIGKILLed while its clients had saved round 2 that the
server had not journaled, resumed, ends as the uninterrupted run. Last, in process: a fresh
run in a results folder whose earlier run kept its client state does not read it.

Times on the 2-core machine, nothing else running: the uninterrupted run (one per node) ~35 s,
sharded ~30 s, deploy_local ~55 s, kill + resume ~60 s, in process ~1 s."""

import base64
from pathlib import Path

import numpy as np
import pytest
from flwr.common.serde import message_from_proto
from flwr.proto.message_pb2 import Message as ProtoMessage
from omegaconf import OmegaConf
from test_sharded_grid import supernodes

from conftest import fedsim_run, journaled, kill_when, private_tmpdir, read_results, without_timings
from fedsim import server_app
from fedsim.config import compose
from fedsim.results import RunOutput
from fedsim_clients.state_probe import NAME, secret

CLIENTS, ROUNDS = 4, 3
RUN = ["experiment=fedtp_aggregate", "task.client=fedsim_clients.state_probe.StateProbeClient",
       f"hardware.num_clients={CLIENTS}", "strategy.noise_multiplier=0", f"num_rounds={ROUNDS}",
       "client_state.keep=true"]
# partition 3's train replies wait 2 s (an in-time timeout fault): a round is journaled about
# 2 s after the other clients saved it, the window in which the resume test kills the run
DELAYED = ["faults.timeout=[3]", "faults.timeout_seconds=2"]


def _run(folder: Path, *extra: str) -> Path:
    """A run of RUN (and ``extra``) with its results and its client state under ``folder``."""
    code, log = fedsim_run(*RUN, *extra, f"results_dir={folder / 'results'}",
                           f"client_state.dir={folder / 'state'}")
    assert code == 0, log[-3000:]
    assert f"[forget] {CLIENTS}/{CLIENTS} replies" in log  # every client was told the run ended
    return folder


def _run_folder(folder: Path) -> Path:
    """The run's client-state folder, named by the key the ServerApp gave it (config.yaml)."""
    return folder / "state" / f"run-{OmegaConf.load(folder / 'results' / 'config.yaml').client_state.run_key}"


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
    leaks = [v[k].tobytes() for by_round in states.values() for v in by_round.values() for k in ("w", "secret")]
    kept = [p for p in results.rglob("*") if p.is_file()]
    assert not [p for p in kept if p.suffix == ".npz" or "client-" in str(p.relative_to(results))]
    entries = journaled(results)
    assert [(e["phase"], e["round"]) for e in entries] == [("aggregate/train", r) for r in range(1, ROUNDS + 1)]
    replies = [base64.b64decode(b) for e in entries for b in e["replies"]]
    for blob in [p.read_bytes() for p in kept] + replies:
        assert not any(leak in blob for leak in leaks)
        assert not any(s.tobytes().hex().encode() in blob for s in map(secret, range(CLIENTS)))
    for blob in replies:
        content = message_from_proto(ProtoMessage.FromString(blob)).content
        assert {name: sorted(record) for name, record in content.items()} == \
            {"arrays": ["vectors"], "metrics": ["num-examples"]}
        assert content["arrays"]["vectors"].numpy().shape == (1, states[0][ROUNDS]["w"].shape[1])


def _same_states(got: dict, want: dict) -> None:
    for p in want:
        for r in want[p]:
            for k in want[p][r]:
                np.testing.assert_array_equal(got[p][r][k], want[p][r][k], err_msg=f"client {p} round {r} {k}")


@pytest.fixture(scope="module")
def one_per_node(tmp_path_factory) -> Path:
    """The uninterrupted run, one SuperNode per client: each layout must end as it does (the
    delay changes no value)."""
    return _run(tmp_path_factory.mktemp("one-per-node"), *DELAYED)


@pytest.mark.e2e
def test_state_chains_per_client_and_stays_on_the_client_one_per_node(one_per_node):
    _check_run(one_per_node)
    assert read_results(one_per_node / "results")["supernodes"] == CLIENTS


@pytest.mark.e2e
@pytest.mark.parametrize("layout", [
    pytest.param(["hardware.clients_per_supernode=2"], id="sharded"),
    pytest.param(["hardware=deploy_local", "hardware.clients_per_supernode=2"], id="deploy_local"),
])
def test_state_chains_per_client_and_stays_on_the_client(one_per_node, tmp_path, layout):
    folder = _run(tmp_path, *layout)
    _same_states(_check_run(folder), _states(one_per_node))
    res, ref = read_results(folder / "results"), read_results(one_per_node / "results")
    assert (res["clients"], res["supernodes"]) == (CLIENTS, 2)
    np.testing.assert_allclose(res["released"], ref["released"], rtol=0, atol=1e-12)


@pytest.mark.e2e
def test_sigkill_after_clients_saved_an_unjournaled_round_then_resume(one_per_node, tmp_path):
    """Killed while every client but the delayed one had saved round 2 and the server had
    journaled round 1 only: the resumed run sends round 2 again, each client re-does it from
    its round-1 value (not from the round-2 value it saved), and the run ends as the
    uninterrupted one: the same client states, the same results."""
    out, state = tmp_path / "results", tmp_path / "state"
    journal = out / "checkpoint" / "journal"

    def saved() -> bool:  # client 0 saved round 2
        return any(state.glob(f"run-*/client-0/{NAME}.r2.npz"))

    kill_when([*RUN, *DELAYED, f"results_dir={out}", f"client_state.dir={state}"], private_tmpdir(),
              lambda: saved() and len(list(journal.glob("*.exchange"))) >= 1)
    assert len(list(journal.glob("*.exchange"))) == 1 and saved() and not (out / "results.json").exists()
    key = OmegaConf.load(out / "config.yaml").client_state.run_key

    code, log = fedsim_run(f"resume={out}")
    assert code == 0, log[-3000:]
    assert "resume: replaying 1 journaled exchanges" in log
    assert OmegaConf.load(out / "config.yaml").client_state.run_key == key  # the same folder
    _same_states(_check_run(tmp_path), _states(one_per_node))
    resumed, reference = read_results(out), read_results(one_per_node / "results")
    assert resumed["checkpoint"] == {"exchanges": ROUNDS, "replayed": 1}
    assert without_timings(resumed) == without_timings(reference)
    assert resumed["released"] == reference["released"]


def _in_process(folder: Path) -> Path:
    """RUN through the ServerApp's code in this process, each client served by the real
    ClientApp handler (no Flower process: seconds, not a layout)."""
    cfg = compose([*RUN, f"results_dir={folder / 'results'}", f"client_state.dir={folder / 'state'}"])
    server_app._run(supernodes(CLIENTS), cfg, RunOutput(cfg.results_dir))
    return folder


def test_a_fresh_run_in_a_used_folder_starts_from_no_client_state(tmp_path):
    """An earlier run in the same results folder kept its client state (``client_state.keep``,
    or it was killed or failed); a fresh run there (not ``resume=``) must not read it. Both used
    to be keyed by the folder's hash: the fresh run's round-1 value was pruned as older than
    the earlier run's rounds 2 and 3, and its round 2 started over."""
    first = _check_run(_in_process(tmp_path))
    key = _run_folder(tmp_path).name
    _same_states(_check_run(_in_process(tmp_path), only=False), first)
    assert _run_folder(tmp_path).name != key and (tmp_path / "state" / key).is_dir()  # kept, not read
