"""Many logical clients per SuperNode, in process: real FedTP clients behind the real ClientApp
handler (mods included), Flower's wire format between them, the ShardedGrid in between."""

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.runtime import client_app
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import ANY, Messenger, PhaseFailed, Policy, client_config
from fedsim.runtime.sharded_grid import (
    CLIENTS,
    LAYOUT,
    SHARD,
    ShardedGrid,
    pack,
    serve_batch,
    unpack,
)
from fedsim.runtime.validators import finite_arrays
from fedsim_clients import fedtp_messages as keys
from fedsim_strategies.dp_mean import DPMean
from fedsim_tasks.topical_chat.dataset import load_topics


def fedtp_slice() -> list[str]:
    """A small FedTP slice; its data root is found when a test asks, not at import: a test that
    imports only :func:`supernodes` (the walkthrough's toy) needs no data."""
    return ["task.max_per_split=3", data_root_override()]


def supernodes(k: int, crash_batches: bool = False, node: dict | None = None) -> InProcessGrid:
    """K SuperNodes (node ids 100+p) serving the real ClientApp handler, each with the node
    config ``node`` (its folders: ``fedsim.config.node_local.from_run(cfg)``, as ``fedsim run`` gives
    the clients it starts)."""

    def supernode(p):
        def handle(msg: Message) -> RecordDict:
            if crash_batches and SHARD in msg.content.config_records:
                raise RuntimeError("the SuperNode's process died")
            context = Context(
                run_id=1,
                node_id=100 + p,
                state=RecordDict(),
                run_config={},
                node_config={**(node or {}), "partition-id": p, "num-partitions": k},
            )
            return client_app.handle(msg, context).content

        return handle

    return InProcessGrid({100 + p: supernode(p) for p in range(k)})


def fedtp_round(grid, cfg, strategy=None) -> tuple[np.ndarray, dict]:
    """One round of ``strategy`` (default DPMean at sigma 0) over every client's topic vector;
    the release and the fault counts."""
    messenger = Messenger(grid, 60.0, poll_seconds=0.0)
    dim = len(load_topics(cfg.data_root))
    train = ConfigRecord({**client_config(cfg), keys.SPLITS: list(cfg.task.splits)})
    strategy = strategy or DPMean(clip_norm=1.0, noise_multiplier=0.0)
    result = strategy.start(
        messenger.grid("aggregate", Policy(ANY, finite_arrays)),
        initial_arrays=ArrayRecord({keys.VECTORS: Array(np.full(dim, 1.0 / dim))}),
        num_rounds=1,
        timeout=60.0,
        train_config=train,
    )
    return result.arrays[keys.VECTORS].numpy().reshape(-1), messenger.faults["aggregate/train"][1]


def test_pack_sends_a_shared_record_once():
    shared = ArrayRecord({"w": Array(np.arange(1000.0))})
    contents = [RecordDict({"arrays": shared, "config": ConfigRecord({"i": i})}) for i in range(3)]
    packed = pack(contents, [5, 6, 7], 10)
    assert len(packed.array_records) == 1 and len(packed.config_records) == 1 + 3
    layout = json.loads(packed[SHARD][LAYOUT])
    for i in range(3):
        got = unpack(packed, layout, i)
        assert got["config"]["i"] == i and np.array_equal(
            got["arrays"]["w"].numpy(), np.arange(1000.0)
        )


def test_logical_clients_release_the_same_prior_as_one_supernode_each():
    cfg = compose(fedtp_slice())
    n = 12
    one_each, faults_one = fedtp_round(supernodes(n), cfg)
    sharded_grid = supernodes(3)
    sharded = ShardedGrid(sharded_grid, n, timeout=60.0, poll=0.0)
    assert list(sharded.get_node_ids()) == list(range(1, n + 1))
    released, faults = fedtp_round(sharded, cfg)
    np.testing.assert_allclose(released, one_each, rtol=0, atol=1e-12)
    assert (
        faults
        == faults_one
        == {"sent": n, "failed": 0, "malformed": 0, "timed_out": 0, "accepted": n, "examples": n}
    )
    # 3 SuperNodes got one message per exchange each (whoami x2, train), not one per client
    train_batches = [
        m for m in sharded_grid.received if m.metadata.message_type == MessageType.TRAIN
    ]
    assert len(train_batches) == 3


def test_a_failing_logical_client_is_its_own_failed_reply():
    cfg = compose([*fedtp_slice(), "faults.crash=[4]", "faults.nan=[7]"])
    released, faults = fedtp_round(ShardedGrid(supernodes(3), 12, timeout=60.0, poll=0.0), cfg)
    assert faults == {
        "sent": 12,
        "failed": 1,
        "malformed": 1,
        "timed_out": 0,
        "accepted": 10,
        "examples": 10,
    }
    assert np.isfinite(released).all()


def test_a_failing_supernode_fails_each_of_its_clients():
    cfg = compose(fedtp_slice())
    grid = ShardedGrid(supernodes(3, crash_batches=True), 12, timeout=60.0, poll=0.0)
    messenger = Messenger(grid, 60.0, poll_seconds=0.0)
    config = ConfigRecord(client_config(cfg))
    with pytest.raises(PhaseFailed, match="its SuperNode failed"):
        messenger.exchange(
            "probe",
            [
                Message(
                    RecordDict({"config": config}), dst_node_id=n, message_type=MessageType.QUERY
                )
                for n in grid.get_node_ids()
            ],
            Policy(ANY),
        )
    assert messenger.faults["probe"][1] == {
        "sent": 12,
        "failed": 12,
        "malformed": 0,
        "timed_out": 0,
        "accepted": 0,
        "examples": 0,
    }


def tampering_supernodes(k: int, tamper) -> InProcessGrid:
    """K SuperNodes (node ids 100+p) that answer a batch as ``serve_batch`` does, each client
    echoing its partition id, then let ``tamper(p, packed)`` change SuperNode p's batch reply."""

    def node(p):
        def client(msg: Message, context: Context) -> Message:
            value = np.array([float(context.node_config["partition-id"])])
            return Message(RecordDict({"arrays": ArrayRecord({"w": Array(value)})}), reply_to=msg)

        def handle(msg: Message) -> RecordDict:
            context = Context(
                run_id=1,
                node_id=100 + p,
                state=RecordDict(),
                run_config={},
                node_config={"partition-id": p, "num-partitions": k},
            )
            if SHARD not in msg.content.config_records:  # whoami
                return client_app.handle(msg, context).content
            return tamper(p, serve_batch(msg, context, client).content)

        return handle

    return InProcessGrid({100 + p: node(p) for p in range(k)})


def _drop_part(packed):
    layout = json.loads(packed[SHARD][LAYOUT])
    layout["records"].pop()
    packed[SHARD][LAYOUT] = json.dumps(layout)
    return packed


def _extra_part(packed):
    layout = json.loads(packed[SHARD][LAYOUT])
    layout["records"].append(layout["records"][0])
    packed[SHARD][CLIENTS] = [*packed[SHARD][CLIENTS], 99]
    packed[SHARD][LAYOUT] = json.dumps(layout)
    return packed


def _bad_part(packed):
    layout = json.loads(packed[SHARD][LAYOUT])
    layout["records"][0] = {"arrays": "no-such-record"}
    layout["records"][1] = ["not", "a", "mapping"]
    packed[SHARD][LAYOUT] = json.dumps(layout)
    return packed


def _no_manifest(packed):
    del packed[SHARD]
    return packed


@pytest.mark.parametrize(
    "tamper, malformed", [(_drop_part, 4), (_extra_part, 4), (_bad_part, 2), (_no_manifest, 4)]
)
def test_a_malformed_batch_reply_is_counted_and_the_others_go_on(tamper, malformed):
    """A SuperNode that answers its batch with a missing, extra or wrongly shaped client part
    (or no manifest) costs those clients a ``malformed`` reply, not the run."""
    grid = ShardedGrid(
        tampering_supernodes(3, lambda p, packed: tamper(packed) if p == 1 else packed),
        12,
        timeout=60.0,
        poll=0.0,
    )
    messenger = Messenger(grid, 60.0, poll_seconds=0.0)
    replies = messenger.exchange(
        "probe",
        [
            Message(
                RecordDict({"config": ConfigRecord({})}),
                dst_node_id=n,
                message_type=MessageType.QUERY,
            )
            for n in grid.get_node_ids()
        ],
        Policy(ANY),
    )
    assert messenger.faults["probe"][1] == {
        "sent": 12,
        "failed": 0,
        "malformed": malformed,
        "timed_out": 0,
        "accepted": 12 - malformed,
        "examples": 12 - malformed,
    }
    for reply in replies:  # every accepted reply is its own client's
        assert reply.content["arrays"]["w"].numpy()[0] == reply.metadata.src_node_id - 1
