"""HEFedAvg: the decrypted aggregate is FedAvg's within CKKS error, the server holds no secret
key and no plaintext update, memory-bounding chunks, and failures inside the chunk phase. Its
clients are served as the ClientApp serves them, through the HE layer around a handler."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedsim.config import node_local
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.privacy.he import ckks as he
from fedsim.privacy.he import messages as keys
from fedsim.privacy.he.client import HEClient, IncompleteGlobal
from fedsim.runtime import client_state
from fedsim.runtime.he_layer import HELayer
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.server_app import seed_server
from fedsim_strategies.he_fedavg import HEFedAvg

PARAMS = he.CKKSParams()


class VectorClient:
    """One node as the ClientApp serves it under HE: its own folders written into each message
    (``node_local.attach``), then the HE layer (``fedsim/runtime/he_layer.py``) around a task whose
    'training' yields a fixed vector (``step``: the weights the layer gave it plus the vector).
    ``fail_on_chunk`` / ``fail_install``: the chunk whose HE operation crashes the node."""

    def __init__(
        self,
        key_dir,
        state_dir,
        partition_id,
        vector,
        examples,
        fail_on_chunk=None,
        fail_install=None,
        step=False,
    ):
        self.node = {"he-key-dir": str(key_dir), "state-dir": str(state_dir)}
        self.partition_id, self.vector, self.examples, self.step = (
            partition_id,
            vector,
            examples,
            step,
        )
        self.fail = {keys.ENCRYPT: fail_on_chunk, keys.INSTALL: fail_install}
        self.layer, self.run = HELayer(self, PARAMS), None

    def __call__(self, msg):
        node_local.attach(msg, self.node)
        self.run = client_state.run_key(msg)
        config = msg.content[keys.CONFIG]
        if keys.OP in config and config[keys.CHUNK] == self.fail[config[keys.OP]]:
            raise RuntimeError("client crashed mid-round")
        return self.layer.handle(msg)

    def initial_weights(self, msg):
        return {"w": np.zeros_like(self.vector)}

    def handle(self, msg):
        """The task's work under the layer: plaintext weights in, plaintext weights out."""
        start = from_record(msg.content[ARRAYS])["w"] if self.step else 0.0
        return RecordDict(
            {
                ARRAYS: to_record({"w": start + self.vector}),
                METRICS: MetricRecord({NUM_EXAMPLES: self.examples, "loss": float(self.examples)}),
            }
        )

    @property
    def he(self) -> HEClient:
        """This node's CKKS state where the layer keeps it: its key, its copies of the aggregate."""
        return HEClient(
            PARAMS,
            self.node["he-key-dir"],
            client_state.client_dir(self.node["state-dir"], self.run, self.partition_id),
        )


def _federation(tmp_path, sizes, dim, fail=None, fail_install=None, step=False):
    rng = np.random.default_rng(0)
    vectors = [rng.normal(size=dim) for _ in sizes]
    clients = {
        i + 1: VectorClient(
            tmp_path / "keys",
            tmp_path / "state",
            i,
            v,
            n,
            (fail or {}).get(i),
            (fail_install or {}).get(i),
            step,
        )
        for i, (v, n) in enumerate(zip(vectors, sizes))
    }
    return vectors, clients


def test_decrypted_aggregate_matches_plaintext_fedavg(tmp_path):
    sizes, dim = [10, 30, 60], 10_000
    vectors, clients = _federation(tmp_path, sizes, dim)
    grid = InProcessGrid(clients)
    strategy = HEFedAvg(FedAvg(min_available_nodes=3, min_train_nodes=3), chunk_floats=4096)
    strategy.start(grid, ArrayRecord(), num_rounds=1, train_config=ConfigRecord({"k": 1}))
    expected = sum(n * v for n, v in zip(sizes, vectors)) / sum(sizes)
    for client in clients.values():
        np.testing.assert_allclose(client.he.global_weights(1), expected, atol=1e-5)
    stats = strategy.rounds[1]
    assert stats["chunks"] == 3 and stats["clients"] == 3
    assert stats["bytes-up-per-client"] > dim * 8  # ciphertexts are larger than the floats
    assert stats["loss"] == pytest.approx(sum(n * n for n in sizes) / sum(sizes))


def test_server_holds_no_secret_key_and_no_plaintext(tmp_path):
    vectors, clients = _federation(tmp_path, [5, 5], 5000)
    grid = InProcessGrid(clients)
    strategy = HEFedAvg(FedAvg(min_available_nodes=2, min_train_nodes=2), chunk_floats=4096)
    strategy.start(grid, ArrayRecord(), num_rounds=2, train_config=ConfigRecord())
    assert strategy.context is not None and not strategy.context.is_private()
    secrets = {c.he.ctx.serialize(save_secret_key=True) for c in clients.values()}
    assert len(secrets) == 1  # the clients share one key
    for reply in grid.received:  # everything the server ever got
        for record in reply.content.array_records.values():
            for name, array in record.items():
                if name == keys.CIPHERTEXT_LENGTHS:  # each ciphertext's byte count, no model value
                    assert array.dtype == "int64"
                    continue
                assert array.dtype == "uint8"  # ciphertext bytes only, never floats
                raw = array.numpy().tobytes()
                assert all(v.astype(np.float64).tobytes()[:64] not in raw for v in vectors)
        for record in reply.content.config_records.values():
            for value in record.values():
                if isinstance(value, bytes):
                    assert not he.server_context(value, PARAMS).is_private()
    with pytest.raises(
        ValueError, match="public context of .* bytes"
    ):  # the key and relinearization keys
        he.server_context(next(iter(secrets)), PARAMS)
    with pytest.raises(
        ValueError, match="secret"
    ):  # the secret key alone: within a public context's size
        he.server_context(
            clients[1].he.ctx.serialize(
                save_secret_key=True, save_public_key=False, save_relin_keys=False
            ),
            PARAMS,
        )
    with pytest.raises(ValueError, match="secret_key"):
        he.decrypt(strategy.context, he.encrypt(clients[1].he.ctx, vectors[0][:10], PARAMS.slots))


def test_client_failing_in_a_chunk_is_left_out_of_that_chunk_only(tmp_path):
    sizes, dim = [10, 30, 60], 9000
    vectors, clients = _federation(tmp_path, sizes, dim, fail={2: 1})  # third client, chunk 1
    strategy = HEFedAvg(FedAvg(min_available_nodes=3, min_train_nodes=3), chunk_floats=4096)
    strategy.start(InProcessGrid(clients), ArrayRecord(), num_rounds=1, train_config=ConfigRecord())
    full = sum(n * v for n, v in zip(sizes, vectors)) / sum(sizes)
    partial = (10 * vectors[0] + 30 * vectors[1]) / 40
    got = clients[1].he.global_weights(1)
    np.testing.assert_allclose(got[:4096], full[:4096], atol=1e-5)
    np.testing.assert_allclose(got[4096:8192], partial[4096:8192], atol=1e-5)
    np.testing.assert_allclose(got[8192:], full[8192:], atol=1e-5)
    assert strategy.rounds[1]["chunk-failures"] == 1


def test_a_missed_install_leaves_no_usable_global_copy(tmp_path):
    """A node that misses one aggregate chunk must not use a part-old, part-new model."""
    _, clients = _federation(tmp_path, [10, 30], 9000, fail_install={1: 1})
    messenger = Messenger(InProcessGrid(clients), timeout=5)
    strategy = HEFedAvg(FedAvg(min_available_nodes=2, min_train_nodes=2), chunk_floats=4096)
    strategy.start(messenger.grid("he"), ArrayRecord(), num_rounds=2, train_config=ConfigRecord())
    assert clients[1].he.global_weights(2).shape == (9000,)
    for rnd in (1, 2):
        with pytest.raises(IncompleteGlobal, match=f"round {rnd}"):
            clients[2].he.global_weights(rnd)
    # the node could not train in round 2 (no round-1 copy): counted, not silently averaged
    assert messenger.faults["he/he-install"][1]["failed"] == 1
    assert (
        messenger.faults["he/train"][2]["accepted"],
        messenger.faults["he/train"][2]["failed"],
    ) == (1, 1)


def test_every_he_phase_is_counted(tmp_path):
    _, clients = _federation(tmp_path, [10, 30, 60], 9000, fail={2: 1})
    messenger = Messenger(InProcessGrid(clients), timeout=5)
    HEFedAvg(FedAvg(min_available_nodes=3, min_train_nodes=3), chunk_floats=4096).start(
        messenger.grid("he"), ArrayRecord(), num_rounds=1, train_config=ConfigRecord()
    )
    assert set(messenger.faults) == {"he/train", "he/he-encrypt", "he/he-install"}
    counts = messenger.faults["he/he-encrypt"][1]  # 3 chunks x 3 nodes, one crash
    assert (counts["sent"], counts["failed"], counts["accepted"]) == (9, 1, 8)
    assert messenger.traffic["he/he-encrypt"][1]["bytes_up"] > 9000 * 8


def test_malformed_he_train_reply_is_rejected_and_counted(tmp_path):
    _, clients = _federation(tmp_path, [10, 30], 5000)
    clients[2].examples = float("nan")
    messenger = Messenger(InProcessGrid(clients), timeout=5)
    HEFedAvg(FedAvg(min_available_nodes=2, min_train_nodes=2), chunk_floats=4096).start(
        messenger.grid("he"), ArrayRecord(), num_rounds=1, train_config=ConfigRecord()
    )
    assert messenger.faults["he/train"][1]["malformed"] == 1
    assert messenger.faults["he/he-encrypt"][1]["sent"] == 2  # one chunk x the accepted node


def test_non_finite_local_update_is_refused_by_the_client(tmp_path):
    client = HEClient(PARAMS, str(tmp_path / "keys"), tmp_path)
    with pytest.raises(ValueError, match="not finite"):
        client.train_reply(np.array([1.0, np.nan]), {"num-examples": 1})


def test_one_trip_rounds_equal_fedavg_in_one_exchange_each(tmp_path):
    sizes, dim = [10, 30, 60], 3000  # fits one 4096-float chunk
    vectors, clients = _federation(tmp_path, sizes, dim, step=True)
    messenger = Messenger(InProcessGrid(clients), timeout=5)
    strategy = HEFedAvg(FedAvg(min_available_nodes=3, min_train_nodes=3), chunk_floats=4096)
    strategy.start(messenger.grid("he"), ArrayRecord(), num_rounds=3, train_config=ConfigRecord())
    step = sum(n * v for n, v in zip(sizes, vectors)) / sum(sizes)  # FedAvg of the updates
    for client in clients.values():  # round t's global is t steps; every node holds round 3's
        np.testing.assert_allclose(client.he.global_weights(3), 3 * step, atol=1e-4)
    # one exchange per round, the aggregate riding with the next round; one install at the end
    assert set(messenger.faults) == {"he/train", "he/he-install"}
    assert sorted(messenger.faults["he/train"]) == [1, 2, 3] and list(
        messenger.faults["he/he-install"]
    ) == [3]
    down = [messenger.traffic["he/train"][r]["bytes_down"] for r in (1, 2, 3)]
    assert (
        down[0] == 0 and down[1] > dim * 8 and down[2] == pytest.approx(down[1], rel=0.01)
    )  # ciphertexts only
    assert all(strategy.rounds[r]["one-trip"] == 1 for r in (1, 2, 3))
    assert strategy.context is not None and not strategy.context.is_private()  # no secret key here


def test_an_update_too_large_for_one_message_takes_the_chunk_path(tmp_path):
    _, clients = _federation(tmp_path, [10, 10], 9000, step=True)
    messenger = Messenger(InProcessGrid(clients), timeout=5)
    HEFedAvg(FedAvg(min_available_nodes=2, min_train_nodes=2), chunk_floats=4096).start(
        messenger.grid("he"), ArrayRecord(), num_rounds=2, train_config=ConfigRecord()
    )
    assert set(messenger.faults) == {"he/train", "he/he-encrypt", "he/he-install"}


@pytest.mark.parametrize(
    "seed", range(8)
)  # the odd client sent first (seeds 5, 6), last, in between
def test_clients_disagreeing_on_the_model_size_are_counted_not_fatal(tmp_path, seed):
    """A reply for a model of another size is malformed: the round goes on with the others; the
    size is the majority's, whichever reply came first (before, the first in send order fixed it:
    an odd client sent first had every other reply refused and set the model alone)."""
    sizes, dim = [10, 30, 60], 5000
    vectors, clients = _federation(tmp_path, sizes, dim)
    clients[3].vector = np.ones(dim + 7)
    messenger = Messenger(InProcessGrid(clients), timeout=5)
    seed_server(seed)
    HEFedAvg(FedAvg(min_available_nodes=3, min_train_nodes=3), chunk_floats=4096).start(
        messenger.grid("he"), ArrayRecord(), num_rounds=1, train_config=ConfigRecord()
    )
    assert messenger.faults["he/train"][1]["malformed"] == 1
    expected = (10 * vectors[0] + 30 * vectors[1]) / 40
    np.testing.assert_allclose(clients[1].he.global_weights(1), expected, atol=1e-5)


@pytest.mark.parametrize("one_trip", [False, True], ids=["chunk phases", "one trip"])
def test_a_node_under_another_key_refuses_the_aggregate(tmp_path, one_trip):
    """A node whose key folder holds another secret key would decrypt the aggregate into
    garbage and install it as its global model; every HE message names the key it was made
    under, so a node under another key refuses it (a failed reply, counted) and holds no global
    model. The run's key is the one most replies share."""
    rng, dim = np.random.default_rng(0), 3000  # one chunk
    vectors = [rng.normal(size=dim) for _ in range(3)]
    clients = {
        i + 1: VectorClient(
            tmp_path / ("other-keys" if i == 2 else "keys"),
            tmp_path / "state",
            i,
            vectors[i],
            10,
            step=one_trip,
        )
        for i in range(3)
    }
    messenger = Messenger(InProcessGrid(clients), timeout=5)
    HEFedAvg(
        FedAvg(min_available_nodes=3, min_train_nodes=3), chunk_floats=4096, one_trip=one_trip
    ).start(messenger.grid("he"), ArrayRecord(), num_rounds=2, train_config=ConfigRecord())
    holders = set()
    for node, client in clients.items():
        try:
            installed = client.he.global_weights(2)
        except IncompleteGlobal:
            continue
        holders.add(node)
        assert installed.shape == (dim,) and np.all(np.isfinite(installed))
    assert holders == {1, 2}  # the majority's key: its nodes hold the model, the other refused it
    assert messenger.faults["he/he-install"][2]["failed"] == 3 - len(holders)
    if not one_trip:  # the aggregate of the replies under the run's key, not garbage
        np.testing.assert_allclose(
            clients[min(holders)].he.global_weights(2),
            np.mean([vectors[n - 1] for n in holders], axis=0),
            atol=1e-4,
        )
