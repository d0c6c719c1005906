"""Client state across rounds: versions by round (what a resumed round reads), the folder per
run and client, the node's own root (never the server's), and the end-of-run forget."""

import json
import os

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from fedsim.config import node_local
from fedsim.runtime import client_app, client_state
from fedsim.runtime.client_state import RUN_KEY, STATE_KEY, ClientState
from fedsim.runtime.inprocess_grid import InProcessGrid


def _msg(root, keep=False, key="abc", extra=None) -> Message:
    """A message of run ``key`` as a handler on a node whose state root is ``root`` sees it."""
    InProcessGrid({})  # this process plays the run (message metadata needs a run id)
    config = ConfigRecord({RUN_KEY: key, STATE_KEY: json.dumps({"keep": keep})})
    msg = Message(
        RecordDict({"config": config, **(extra or {})}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    node_local.attach(msg, {"state-dir": str(root)})
    return msg


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


def test_each_client_has_its_folder_under_the_run_of_the_node_root(tmp_path):
    assert (
        client_state.of(_msg(tmp_path / "node-root"), 3).folder
        == tmp_path / "node-root" / "run-abc" / "client-3"
    )


def _served(msg: Message, node_config: dict) -> Message:
    context = Context(
        run_id=1,
        node_id=1,
        state=RecordDict(),
        run_config={},
        node_config={"partition-id": 0, "num-partitions": 1, **node_config},
    )
    return client_app._client_reply(msg, context)


def _from_server(victim, extra: dict, message_type=MessageType.QUERY) -> Message:
    """A message of a server that names ``victim`` as the clients' root, in every way a message
    could: the run's client-state settings and the node's own entry."""
    InProcessGrid({})
    config = ConfigRecord(
        {
            RUN_KEY: "abc",
            STATE_KEY: json.dumps({"dir": str(victim), "keep": False}),
            node_local.NODE_KEY: json.dumps({"state-dir": str(victim)}),
            **extra.pop("config", {}),
        }
    )
    return Message(
        RecordDict({"config": config, **extra}), dst_node_id=1, message_type=message_type
    )


@pytest.mark.parametrize(
    "node_config", [{}, {"state-dir": "node"}], ids=["environment", "node-config"]
)
def test_a_server_cannot_choose_where_a_client_keeps_or_removes_state(
    tmp_path, monkeypatch, node_config
):
    """The attack: a server names the root of another folder in its end-of-run forget (it
    removed ``/victim/run-<key>/``) or in a train message (the client created folders where the
    server said). The node's own root (its node config, else its environment) is used, always."""
    victim = tmp_path / "victim"
    (victim / "run-abc" / "client-0").mkdir(parents=True)
    (victim / "run-abc" / "client-0" / "precious").write_text("not the server's")
    monkeypatch.setenv("FEDSIM_STATE_DIR", str(tmp_path / "env"))
    node_config = {k: str(tmp_path / v) for k, v in node_config.items()}
    own = tmp_path / ("node" if node_config else "env")
    client_state.ClientState(client_state.client_dir(str(own), "abc", 0)).save(
        "w", 1, {"a": np.zeros(1)}
    )

    roots = []  # the data roots the ClientApp builds clients with
    build = client_app._client
    monkeypatch.setattr(
        client_app, "_client", lambda task, root, *a: roots.append(root) or build(task, root, *a)
    )
    task = {"client": "fedsim_clients.state_probe.StateProbeClient", "data_root": str(victim)}
    train = _from_server(
        victim / "new",
        {
            "config": {client_app.TASK_KEY: json.dumps(task), "server-round": 1},
            "arrays": ArrayRecord({"vectors": Array(np.full((1, 4), 0.25))}),
        },
        MessageType.TRAIN,
    )
    assert not _served(train, node_config).has_error()
    assert (
        not (victim / "new").exists() and (own / "run-abc" / "client-0" / "probe.r1.npz").is_file()
    )
    assert roots and str(victim) not in roots  # nor does it read data where the server says

    forget = _from_server(victim, {client_state.FORGET: client_state.forget_request("abc")})
    assert _served(forget, node_config).content[client_state.FORGET]["removed"]
    assert (victim / "run-abc" / "client-0" / "precious").is_file()  # untouched
    assert not (own / "run-abc").exists()  # the node's own run folder went


@pytest.mark.parametrize("keep", [False, True])
def test_forget_removes_the_run_unless_kept(tmp_path, keep):
    client_state.of(_msg(tmp_path), 0).save("w", 1, {"a": np.zeros(2)})
    other = client_state.of(_msg(tmp_path, key="other"), 0)
    other.save("w", 1, {"a": np.zeros(2)})
    forget = _msg(
        tmp_path, keep=keep, extra={client_state.FORGET: client_state.forget_request("abc")}
    )
    assert client_state.forget(forget) is not keep
    assert (tmp_path / "run-abc").exists() is keep
    assert other.load("w", 2) is not None  # another run's state is untouched


def test_a_run_key_from_the_server_cannot_leave_the_root(tmp_path):
    (tmp_path / "keep-me").mkdir()
    forget = _msg(
        tmp_path / "root", extra={client_state.FORGET: client_state.forget_request("../keep-me")}
    )
    with pytest.raises(ValueError, match="run key"):
        client_state.forget(forget)
    with pytest.raises(ValueError, match="run key"):
        client_state.of(_msg(tmp_path / "root", key="../keep-me"), 0)
    assert (tmp_path / "keep-me").is_dir()


def _mode(path) -> int:
    return path.stat().st_mode & 0o777


def test_another_local_user_cannot_read_or_plant_client_state(tmp_path, monkeypatch):
    """The attack: another local user creates the state root first, open to all (the default
    one lies in the machine's shared temporary folder), then reads the clients' models and
    DP-SGD ledgers or swaps them between rounds. A root open to others (or another user's) is
    refused; the root, run and client folders are made owner-only; the default is per user."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # past the umask, as another user's folder would be
    with pytest.raises(PermissionError, match="mode 0700"):
        client_state.client_dir(str(shared), "abc", 0)
    assert not (shared / "run-abc").exists()

    own = tmp_path / "own"
    folder = client_state.client_dir(str(own), "abc", 0)
    assert [_mode(p) for p in (own, own / "run-abc", folder)] == [0o700] * 3

    monkeypatch.setattr(client_state.tempfile, "gettempdir", lambda: str(tmp_path))
    default = client_state.client_dir(None, "abc", 0)
    assert (
        default.parent.parent == tmp_path / f"fedsim-clients-{os.getuid()}"
        and _mode(default.parent.parent) == 0o700
    )
