"""``hardware.client_backend: batched``: a SuperNode's hosted clients reply as stacked rows
(``fedsim/runtime/row_batches.py``). Real FedTP and turn-sentiment clients behind the real
ClientApp handler (mods included), Flower's wire format between them: the results equal the
``messages`` backend's, and a bad row is its own client's fault only."""

import json
import tempfile

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from test_sharded_grid import fedtp_round, fedtp_slice, supernodes, tampering_supernodes

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.flower.strategies import KEY_CLIPPING_NORM
from fedsim.privacy.plan import PrivacyPlan
from fedsim.privacy.secagg import messages as secagg_keys
from fedsim.results.outputs import RunOutput
from fedsim.runtime import client_app, server_app
from fedsim.runtime.faults import FAULTS_KEY
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import ANY, Messenger, Policy, client_config
from fedsim.runtime.row_batches import ROWS, split_rows, stack
from fedsim.runtime.sharded_grid import LAYOUT, SHARD, ShardedGrid
from fedsim.runtime.validators import finite_arrays
from fedsim_clients import fedtp_messages as fedtp_keys
from fedsim_clients.topic_preference import TopicPreferenceClient
from fedsim_clients.turn_sentiment import TurnSentimentClient
from fedsim_experiments.turn_sentiment import protocol as turn_sentiment
from fedsim_tasks.topical_chat.turn_sentiment import Recipe

N, K = 12, 3


def reply(i: int, rows: int = 1) -> RecordDict:
    return RecordDict(
        {
            "arrays": ArrayRecord({"v": Array(np.full((rows, 4), i, dtype=np.float32))}),
            "metrics": MetricRecord({"num-examples": i, "loss": i / 3}),
        }
    )


def test_replies_of_one_shape_stack_and_split_back_to_the_same_bytes():
    contents = [reply(i) for i in range(5)] + [reply(9, rows=2)]
    packed, single, manifest = stack(contents)
    assert single == [] and [g["members"] for g in manifest] == [[0, 1, 2, 3, 4], [5]]
    assert packed[f"{ROWS}/0/arrays"]["v"].shape == (5, 1, 4)
    parts = split_rows(packed, manifest)
    for i, content in enumerate(contents):
        assert parts[i]["arrays"]["v"].data == content["arrays"]["v"].data  # np.save's bytes
        assert dict(parts[i]["metrics"]) == dict(content["metrics"])
        assert type(parts[i]["metrics"]["num-examples"]) is int


def test_fedtp_release_and_counts_equal_the_messages_backend():
    cfg = compose(fedtp_slice())
    by_message = fedtp_round(ShardedGrid(supernodes(K), N, timeout=60.0, poll=0.0), cfg)
    raw = supernodes(K)
    grid = ShardedGrid(raw, N, timeout=60.0, poll=0.0, reply_rows=True, balance=True)
    by_rows = fedtp_round(grid, cfg)
    np.testing.assert_array_equal(by_rows[0], by_message[0])
    assert by_rows[1] == by_message[1] and by_rows[1]["accepted"] == N
    train = [m for m in raw.received if m.metadata.message_type == MessageType.TRAIN]
    assert len(train) == K  # one reply per SuperNode, its clients' rows in one array
    # whatever its client count: the vectors' and the metrics' stacked records, the manifest
    assert all(len(m.content) == 3 for m in train)


def fedtp_replies(monkeypatch) -> list[RecordDict]:
    raw = supernodes(K)
    fedtp_round(
        ShardedGrid(raw, N, timeout=60.0, poll=0.0, reply_rows=True), compose(fedtp_slice())
    )
    return [m.content for m in raw.received if m.metadata.message_type == MessageType.TRAIN]


def turn_sentiment_replies(monkeypatch) -> list[RecordDict]:
    """One round of turn-sentiment FedAvg, 70 clients on 2 SuperNodes (more than a batched
    computation's 64), every client sampled."""
    cfg = compose(
        [
            "experiment=turn_sentiment_fedavg",
            data_root_override(),
            "hardware.num_clients=140",
            "hardware.clients_per_supernode=70",
            "hardware.client_backend=batched",
            "protocol.clients_per_round=140",
            "num_rounds=1",
        ]
    )
    raw = supernodes(2)
    grid = ShardedGrid(raw, 140, timeout=60.0, poll=0.0, reply_rows=True)
    messenger = Messenger(grid, 60.0, poll_seconds=0.0, know_partitions=True)
    server_app.seed_server(int(cfg.seed))
    out = RunOutput(tempfile.mkdtemp())
    turn_sentiment.run(messenger, cfg, out, PrivacyPlan.build(cfg, b"k" * 32))
    return [m.content for m in raw.received if m.metadata.message_type == MessageType.TRAIN]


@pytest.mark.parametrize(
    "handler, replies",
    [(TopicPreferenceClient, fedtp_replies), (TurnSentimentClient, turn_sentiment_replies)],
)
def test_clients_answered_as_rows_reply_what_they_reply_one_by_one(monkeypatch, handler, replies):
    """A SuperNode answers its hosted clients' train message from their columns (the handler
    class's ``train_rows``) with no handler object or reply per client, and sends the very
    bytes it sends serving them one by one."""
    monkeypatch.setattr(handler, "train_rows", classmethod(lambda *a: None))
    one_by_one = replies(monkeypatch)
    monkeypatch.undo()
    trained = []
    monkeypatch.setattr(handler, "train", lambda self, msg: trained.append(self) or 1 / 0)
    as_rows = replies(monkeypatch)
    assert not trained and len(as_rows) == len(one_by_one) > 0
    for rows, alone in zip(as_rows, one_by_one):
        assert list(rows.keys()) == list(alone.keys())
        assert rows[SHARD][LAYOUT] == alone[SHARD][LAYOUT]
        for name, record in rows.array_records.items():
            assert {k: a.data for k, a in record.items()} == {
                k: a.data for k, a in alone[name].items()
            }


def _fedtp_train(**config) -> Message:
    InProcessGrid({})  # this process plays the run (message metadata needs a run id)
    cfg = compose(fedtp_slice())
    base = {**client_config(cfg), fedtp_keys.SPLITS: list(cfg.task.splits)}
    return Message(
        RecordDict({"config": ConfigRecord({**base, **config})}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )


@pytest.mark.parametrize(
    "why, msg",
    [
        (
            "a fault on one of them",
            lambda: _fedtp_train(
                **{FAULTS_KEY: json.dumps({"nan": [3], "message_types": ["train"]})}
            ),
        ),
        ("client-side clipping", lambda: _fedtp_train(**{KEY_CLIPPING_NORM: 1.0})),
        ("a SecAgg+ stage", lambda: _fedtp_train(**{secagg_keys.OP: secagg_keys.SHARE})),
        (
            "not a train message",
            lambda: Message(
                _fedtp_train().content, dst_node_id=1, message_type=MessageType.EVALUATE
            ),
        ),
    ],
)
def test_clients_a_layer_would_touch_are_not_answered_as_rows(why, msg):
    context = Context(run_id=1, node_id=100, state=RecordDict(), run_config={}, node_config={})
    assert client_app._rows_reply(_fedtp_train(), [2, 3], N, context) is not None
    assert client_app._rows_reply(msg(), [2, 3], N, context) is None, why


def test_a_malformed_row_is_counted_without_dropping_its_neighbours():
    cfg = compose([*fedtp_slice(), "faults.nan=[7, 9]", "faults.crash=[4]"])
    grid = ShardedGrid(supernodes(K), N, timeout=60.0, poll=0.0, reply_rows=True)
    released, faults = fedtp_round(grid, cfg)
    assert faults == {
        "sent": N,
        "failed": 1,
        "malformed": 2,
        "timed_out": 0,
        "accepted": N - 3,
        "examples": N - 3,
    }
    expected, _ = fedtp_round(ShardedGrid(supernodes(K), N, timeout=60.0, poll=0.0), cfg)
    np.testing.assert_array_equal(released, expected)


def _short_group(p: int, packed: RecordDict) -> RecordDict:
    """SuperNode 1 sends its stacked array one row short: its clients cannot be told apart."""
    if p == 1:
        record = packed[f"{ROWS}/0/arrays"]
        record["w"] = Array(record["w"].numpy()[:-1])
    return packed


def _nan_row(p: int, packed: RecordDict) -> RecordDict:
    """SuperNode 1 puts a NaN in its second client's row of the stacked array."""
    if p == 1:
        record = packed[f"{ROWS}/0/arrays"]
        matrix = record["w"].numpy().copy()
        matrix[1] = np.nan
        record["w"] = Array(matrix)
    return packed


@pytest.mark.parametrize("tamper, malformed", [(_short_group, 4), (_nan_row, 1)])
def test_a_bad_row_group_or_row_costs_its_own_clients_only(tamper, malformed):
    grid = ShardedGrid(tampering_supernodes(K, tamper), N, timeout=60.0, poll=0.0, reply_rows=True)
    replies, messenger = _probe(grid, list(grid.get_node_ids()))
    counts = messenger.faults["probe"][1]
    assert (counts["malformed"], counts["accepted"]) == (malformed, N - malformed)
    for reply in replies:  # every accepted reply is its own client's row
        assert reply.content["arrays"]["w"].numpy()[0] == reply.metadata.src_node_id - 1


@pytest.mark.slow
def test_turn_sentiment_fedavg_equals_the_messages_backend(tmp_path, monkeypatch):
    """The batched backend runs each SuperNode's sampled clients' epochs as one batched
    computation (``fedsim/runtime/hosted_work.py``): the same run to float order, the same
    fault counts, and the epochs were batched (6 clients a round on 2 SuperNodes). Served by
    other SuperNodes (unbalanced: each client by its host, as a resumed run may serve them),
    the batched run is the same to the bit: a reply depends on no peer."""
    batches = []
    batched_epochs = Recipe.local_updates

    def spy(self, weights, clients, *args):
        batches.append(tuple(clients))
        return batched_epochs(self, weights, clients, *args)

    monkeypatch.setattr(Recipe, "local_updates", spy)

    def run(backend: str, balance: bool = True) -> dict:
        cfg = compose(
            [
                "experiment=turn_sentiment_fedavg",
                data_root_override(),
                "hardware.num_clients=40",
                "hardware.clients_per_supernode=20",
                f"hardware.client_backend={backend}",
                "protocol.clients_per_round=6",
                "num_rounds=2",
                f"results_dir={tmp_path / backend / str(balance)}",
            ]
        )
        batched = backend == "batched"  # rows, and each round spread over the SuperNodes by load
        grid = ShardedGrid(
            supernodes(2),
            40,
            timeout=60.0,
            poll=0.0,
            reply_rows=batched,
            balance=batched and balance,
        )
        messenger = Messenger(grid, 60.0, poll_seconds=0.0, know_partitions=True)
        server_app.seed_server(int(cfg.seed))
        out = RunOutput(cfg.results_dir)
        results, _ = turn_sentiment.run(messenger, cfg, out, PrivacyPlan.build(cfg, b"k" * 32))
        return {"loss": results["loss"], "curve": results["curve"], "faults": messenger.faults}

    by_message = run("messages")
    assert batches == []
    by_rows = run("batched")
    assert sum(map(len, batches)) == 12 and max(map(len, batches)) > 1, batches
    balanced = list(batches)
    batches.clear()
    assert run("batched", balance=False) == by_rows
    assert batches != balanced  # other clients shared each computation

    assert by_rows["faults"] == by_message["faults"]
    assert by_rows["loss"] == pytest.approx(by_message["loss"], rel=1e-6)
    for ours, theirs in zip(by_rows["curve"], by_message["curve"], strict=True):
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            assert value == (
                pytest.approx(theirs[key], rel=1e-6) if isinstance(value, float) else theirs[key]
            )


def test_whoami_asks_no_logical_client_and_forget_goes_once_per_supernode(tmp_path):
    """The batched backend knows its clients' partitions from where it placed them (their
    SuperNodes told theirs at the start) and removes the run's client state, one folder per
    run and machine, with one forget per SuperNode."""
    cfg = compose([*fedtp_slice(), f"results_dir={tmp_path}"])
    raw = supernodes(K)
    grid = ShardedGrid(raw, N, timeout=60.0, poll=0.0, reply_rows=True)
    messenger = Messenger(grid, 60.0, poll_seconds=0.0, know_partitions=True)
    assert messenger.partitions == {n: n - 1 for n in range(1, N + 1)}
    assert messenger.faults["whoami"][1]["accepted"] == N
    assert len(raw.received) == K  # the SuperNodes' own whoami, nothing per client
    server_app._forget_client_state(messenger, cfg)
    forgets = raw.received[K:]
    assert len(forgets) == K and messenger.faults["forget"][1]["accepted"] == K
    assert all(len(json.loads(m.content[SHARD][LAYOUT])["records"]) == 1 for m in forgets)


def _probe(grid: ShardedGrid, nodes: list[int]) -> tuple[list[Message], Messenger]:
    messenger = Messenger(grid, 60.0, poll_seconds=0.0)
    messages = [Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY) for n in nodes]
    return messenger.exchange("probe", messages, Policy(ANY, finite_arrays)), messenger


def test_balanced_serving_spreads_a_round_over_the_supernodes_with_the_same_replies():
    """Clients 0, 3, 6, 9 all live on SuperNode 0 (l mod 3): balanced, a round of them goes to
    every SuperNode, each client's reply still its own; unbalanced, to SuperNode 0 alone."""
    nodes = [1, 4, 7, 10]
    for balance, batches in ((False, 1), (True, K)):
        raw = tampering_supernodes(K, lambda p, packed: packed)
        grid = ShardedGrid(raw, N, timeout=60.0, poll=0.0, reply_rows=True, balance=balance)
        raw.received.clear()
        replies, _ = _probe(grid, nodes)
        assert len(raw.received) == batches
        assert [r.content["arrays"]["w"].numpy()[0] for r in replies] == [0.0, 3.0, 6.0, 9.0]


def test_balanced_serving_weighs_clients_by_their_last_examples():
    grid = ShardedGrid(supernodes(2), 6, timeout=60.0, poll=0.0, balance=True)
    grid.load = {1: 10.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 6.0}
    servers = grid.servers(list(range(1, 7)))
    heavy = servers[1]
    assert [n for n, host in servers.items() if host == heavy] == [1]  # 10 against 6 + 4 x 1
