"""Client state across rounds (``fedsim/client_state.py``) through the ServerApp's code with
the stateful test client ``clients/state_probe.py`` (3 rounds of FedTP's aggregation, 4
clients): every client's round t reads what it saved in round t-1, in its own folder, and no
state array reaches the server; a fresh run in a results folder whose earlier run kept its
client state does not read it."""

import base64
from pathlib import Path

import numpy as np
import pytest
from flwr.common.serde import message_from_proto
from flwr.proto.message_pb2 import Message as ProtoMessage
from omegaconf import OmegaConf
from test_sharded_grid import supernodes

from clients.state_probe import NAME, secret
from conftest import journaled
from fedsim import server_app
from fedsim.config import compose
from fedsim.results import RunOutput

CLIENTS, ROUNDS = 4, 3
RUN = ["experiment=fedtp_aggregate", "task.client=clients.state_probe.StateProbeClient",
       f"hardware.num_clients={CLIENTS}", "strategy.noise_multiplier=0", f"num_rounds={ROUNDS}",
       "client_state.keep=true"]


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
