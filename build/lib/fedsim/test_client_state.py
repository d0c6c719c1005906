"""Client state across rounds: versions by round (what a resumed round reads), the folder per
run and client, the node's own root, and the end-of-run forget."""

import json

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fedsim import client_state
from fedsim.client_state import RUN_KEY, STATE_KEY, ClientState
from fedsim.inprocess_grid import InProcessGrid


def _msg(root, keep=False, key="abc", extra=None) -> Message:
    InProcessGrid({})  # this process plays the run (message metadata needs a run id)
    config = ConfigRecord({RUN_KEY: key, STATE_KEY: json.dumps({"dir": str(root), "keep": keep})})
    return Message(RecordDict({"config": config, **(extra or {})}), dst_node_id=1, message_type=MessageType.TRAIN)


def test_a_round_reads_the_newest_value_saved_before_it(tmp_path):
    state = ClientState(tmp_path)
    assert state.load("w", 1) is None
    for rnd in (1, 2, 3):
        state.save("w", rnd, {"a": np.full(3, float(rnd), np.float32)})
    assert state.load("w", 4)["a"].tolist() == [3.0, 3.0, 3.0]
    # round 3 sent again after a resume reads round 2's value, as the first time
    assert state.load("w", 3)["a"].tolist() == [2.0, 2.0, 2.0]
    assert state.load("w", 2) is None  # round 1's value was pruned: two versions are kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.r2.npz", "w.r3.npz"]
    assert state.bytes() == sum(p.stat().st_size for p in tmp_path.iterdir())


def test_names_are_plain_and_values_are_not_pickled(tmp_path):
    state = ClientState(tmp_path)
    with pytest.raises(ValueError, match="state name"):
        state.save("../x", 1, {"a": np.zeros(1)})
    with pytest.raises(ValueError):
        state.save("w", 1, {"a": np.array([object()], dtype=object)})


def test_each_client_has_its_folder_under_the_run_and_the_node_root_wins(tmp_path):
    msg = _msg(tmp_path / "run-root")
    assert client_state.of(msg, 3).folder == tmp_path / "run-root" / "run-abc" / "client-3"
    client_state.with_node_root(msg, str(tmp_path / "node-root"))
    assert client_state.of(msg, 3).folder == tmp_path / "node-root" / "run-abc" / "client-3"


@pytest.mark.parametrize("keep", [False, True])
def test_forget_removes_the_run_unless_kept(tmp_path, keep):
    client_state.of(_msg(tmp_path), 0).save("w", 1, {"a": np.zeros(2)})
    other = client_state.of(_msg(tmp_path, key="other"), 0)
    other.save("w", 1, {"a": np.zeros(2)})
    forget = _msg(tmp_path, keep=keep, extra={client_state.FORGET: client_state.forget_request("abc")})
    assert client_state.forget(forget) is not keep
    assert (tmp_path / "run-abc").exists() is keep
    assert other.load("w", 2) is not None  # another run's state is untouched


def test_a_run_key_from_the_server_cannot_leave_the_root(tmp_path):
    (tmp_path / "keep-me").mkdir()
    forget = _msg(tmp_path / "root", extra={client_state.FORGET: client_state.forget_request("../keep-me")})
    with pytest.raises(ValueError, match="run key"):
        client_state.forget(forget)
    with pytest.raises(ValueError, match="run key"):
        client_state.of(_msg(tmp_path / "root", key="../keep-me"), 0)
    assert (tmp_path / "keep-me").is_dir()
