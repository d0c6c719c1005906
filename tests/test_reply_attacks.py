"""One client must not stop or steer a run (issue 36). Each reply below, sent by one client among
honest ones, ended the run before (the exception escaped the exchange) or moved its result; each
is now counted ``malformed`` (or, for a duplicate partition claim, refused) and the result is
the one the honest clients give. The protocols' own phase code runs (``fedsim_experiments``), its
clients are fakes that answer as the real ones do (``fedsim_clients``), in process."""

import json
from functools import cache

import numpy as np
import pytest
import tenseal
from cryptography.hazmat.primitives.serialization import load_ssh_public_key
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from omegaconf import OmegaConf
from test_sharded_grid import supernodes, tampering_supernodes

from conftest import data_root_override
from fedsim.config.compose import compose
from fedsim.flower.messages import NodeInfo, public_key_to_bytes
from fedsim.message_keys import PARTITION_ID, RAY_NODE
from fedsim.privacy.he import messages as he_keys
from fedsim.privacy.plan import PrivacyPlan
from fedsim.run.tls import Certificates, make_federation, partition_keys
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.journal import NODE_KEYS_ENV, WHOAMI
from fedsim.runtime.messaging import ANY, Messenger, PhaseFailed, Policy, client_config
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.sharded_grid import LAYOUT, SHARD, ShardedGrid
from fedsim_clients import fede4rag_messages as rag
from fedsim_clients import fedtp_messages as tp
from fedsim_clients import preference_messages as pref
from fedsim_experiments.common import build_strategy, discover
from fedsim_experiments.fedbiscuit import protocol as fedbiscuit
from fedsim_experiments.fede4rag import protocol as fede4rag
from fedsim_experiments.fedtp import protocol as fedtp
from fedsim_strategies.test_he_fedavg import VectorClient

DATA = data_root_override()
HONEST = (
    3  # honest clients, node ids 1..3 (partitions 0..2); the hostile one is node 4 (partition 3)
)
HOSTILE = 4


def messenger_of(handlers: dict, partitions: bool = False) -> Messenger:
    return Messenger(InProcessGrid(handlers), timeout=5, know_partitions=partitions)


# --- FedTP: the prior (DPMean), the lambda sweep ---------------------------------------------

DIM = 4


def _fedtp_client(topic: int, hostile=None):
    """Node of partition ``topic``: its one conversation prefers topic ``topic``; ``hostile``
    replaces its train reply."""

    def handle(msg):
        if msg.metadata.message_type == MessageType.TRAIN:
            if hostile is not None:
                return hostile
            return RecordDict(
                {
                    tp.ARRAYS: ArrayRecord({tp.VECTORS: Array(np.eye(DIM)[[topic]])}),
                    tp.METRICS: MetricRecord({tp.NUM_EXAMPLES: 1}),
                }
            )
        if WHOAMI in msg.content.config_records:
            return RecordDict({WHOAMI: ConfigRecord({PARTITION_ID: topic})})
        names = list(msg.content[tp.CONFIG][tp.VARIANT_NAMES])
        return RecordDict(
            {
                tp.METRICS: MetricRecord(
                    {
                        tp.NUM_EXAMPLES: 2,
                        "valid_freq/turns": 2,
                        **{
                            f"valid_freq/{name}/{m}": (topic % 2 if m == "hits" else 0.5)
                            for name in names
                            for m in ("hits", "err", "support")
                        },
                    }
                )
            }
        )

    return handle


def _fedtp_context(handlers) -> fedtp.Context:
    cfg = compose(["experiment=fedtp", DATA, "num_rounds=1", "strategy.noise_multiplier=0"])
    messenger = messenger_of(handlers)
    hosted = {
        n: ConfigRecord({tp.INFO_SPLITS: ["valid_freq"], tp.INFO_ROWS: [n - 1]}) for n in handlers
    }
    task = {
        **OmegaConf.to_container(cfg.task, resolve=True),
        "prior_splits": ["valid_freq"],
        "tune_splits": ["valid_freq"],
    }
    strategy = build_strategy(cfg, PrivacyPlan.fresh(cfg), len(messenger.node_ids()))
    return fedtp.Context(messenger, cfg, client_config(cfg), task, strategy, hosted)


def _prior(hostile=None):
    handlers = {n: _fedtp_client(n - 1) for n in range(1, HONEST + 1)}
    handlers[HOSTILE] = _fedtp_client(HOSTILE - 1, hostile)
    ctx = _fedtp_context(handlers)
    return fedtp.train_prior(ctx, DIM).vector, ctx.messenger.faults["prior/train"][1]


def _rows(vectors, examples=1) -> RecordDict:
    return RecordDict(
        {
            tp.ARRAYS: ArrayRecord({tp.VECTORS: Array(np.asarray(vectors))}),
            tp.METRICS: MetricRecord({tp.NUM_EXAMPLES: examples}),
        }
    )


HONEST_PRIOR = np.array([1, 1, 1, 0]) / 3.0  # the three honest clients' topics, each once

PRIOR_ATTACKS = {
    "num-examples NaN": _rows(np.eye(DIM)[[3]], float("nan")),
    "num-examples inf": _rows(np.eye(DIM)[[3]], float("inf")),
    "num-examples a list": _rows(np.eye(DIM)[[3]], [1, 1]),
    "vectors of a string dtype": _rows(np.array([["a", "b", "c", "d"]])),
    "1000 rows from a node hosting one conversation": _rows(np.tile(np.eye(DIM)[[3]], (1000, 1))),
}


@pytest.mark.parametrize("attack", PRIOR_ATTACKS)
def test_a_hostile_prior_reply_is_counted_and_the_prior_is_the_honest_one(attack):
    prior, faults = _prior(PRIOR_ATTACKS[attack])
    np.testing.assert_allclose(prior, HONEST_PRIOR, atol=1e-12)
    assert faults["malformed"] == 1 and faults["accepted"] == HONEST


def test_a_list_where_a_number_is_expected_in_an_evaluation_reply():
    hostile = RecordDict(
        {tp.METRICS: MetricRecord({tp.NUM_EXAMPLES: 2, "valid_freq/turns": [2, 2]})}
    )
    handlers = {n: _fedtp_client(n - 1) for n in range(1, HONEST + 1)}
    honest_sweep, _ = fedtp.tune_lambda(_fedtp_context(handlers), HONEST_PRIOR)

    def evaluate_hostile(msg):
        return (
            hostile if msg.metadata.message_type == MessageType.EVALUATE else _fedtp_client(3)(msg)
        )

    ctx = _fedtp_context({**handlers, HOSTILE: evaluate_hostile})
    sweep, _ = fedtp.tune_lambda(ctx, HONEST_PRIOR)
    assert sweep == honest_sweep and ctx.messenger.faults["tune"][1]["malformed"] == 1


# --- FedBis / FedBiscuit: FedAvg and SelectorGroups over preference clients ------------------

EXAMPLES = 50


def _preference_client(partition: int, target: float, train=None, report=None):
    """A preference client holding EXAMPLES pairs: its training returns ``target``; its regroup
    report is the squared distance of each selector to it. ``train`` / ``report`` replace the
    replies (a function of the message)."""

    def handle(msg):
        metrics = {pref.NUM_EXAMPLES: EXAMPLES, pref.UNIT_WEIGHT: 1.0}
        if msg.metadata.message_type == MessageType.QUERY:
            return RecordDict(
                {
                    pref.INFO: ConfigRecord(
                        {
                            pref.PARTITION_ID: partition,
                            pref.NUM_EXAMPLES: EXAMPLES,
                            pref.NUM_VALID: 5,
                            pref.POPULATION: "majority",
                        }
                    )
                }
            )
        if msg.metadata.message_type == MessageType.TRAIN:
            if train is not None:
                return train(msg)
            w = from_record(msg.content[pref.ARRAYS])["w"]
            return RecordDict(
                {
                    pref.ARRAYS: to_record({"w": np.full_like(w, target)}),
                    pref.METRICS: MetricRecord(
                        {**metrics, "train-seconds": 0.1, "train-loss": 0.5}
                    ),
                }
            )
        if report is not None:
            return report(msg)
        losses = {
            f"{pref.LOSS_PREFIX}{name.removeprefix(pref.MODEL_PREFIX)}": float(
                np.sum((from_record(r)["w"] - target) ** 2)
            )
            for name, r in msg.content.array_records.items()
        }
        return RecordDict({pref.METRICS: MetricRecord({**losses, **metrics})})

    return handle


def _preference_context(handlers, *overrides) -> fedbiscuit.Context:
    cfg = compose(
        [
            "experiment=fedbiscuit_paper",
            DATA,
            "num_rounds=2",
            "protocol.fraction_train=1.0",
            "protocol.warmup_rounds=1",
            "protocol.regroup_every=1",
            *overrides,
        ]
    )
    messenger = messenger_of(handlers)
    base = client_config(cfg)
    nodes, records = discover(messenger, base)
    info = {
        p: {k: r[k] for k in (pref.NUM_EXAMPLES, pref.NUM_VALID, pref.POPULATION)}
        for p, r in records.items()
    }
    return fedbiscuit.Context(
        messenger,
        cfg,
        base,
        nodes,
        info,
        None,
        {"w": np.zeros(2, np.float32)},
        plan=PrivacyPlan.fresh(cfg),
    )


def _fedbis(train=None, **overrides) -> tuple[np.ndarray, dict, dict]:
    handlers = {n: _preference_client(n - 1, float(n)) for n in range(1, HONEST + 1)}
    handlers[HOSTILE] = _preference_client(HOSTILE - 1, 2.0, train=train)
    ctx = _preference_context(handlers)
    out = fedbiscuit.fedbis(
        ctx, "fedbis", OmegaConf.create({"run": "fedsim_experiments.fedbiscuit.protocol.fedbis"})
    )
    return out["selectors"][0]["w"], out["details"]["rounds"], ctx.messenger.faults["fedbis/train"]


def _trained(metrics: dict | None, arrays=None):
    """A train reply as a preference client's, value 2 (an honest client's), with ``metrics``."""

    def train(msg):
        w = from_record(msg.content[pref.ARRAYS])["w"]
        content = RecordDict(
            {pref.ARRAYS: to_record(arrays if arrays is not None else {"w": np.full_like(w, 2.0)})}
        )
        if metrics is not None:
            content[pref.METRICS] = MetricRecord(metrics)
        return content

    return train


HONEST_METRICS = {
    pref.NUM_EXAMPLES: EXAMPLES,
    pref.UNIT_WEIGHT: 1.0,
    "train-seconds": 0.1,
    "train-loss": 0.5,
}
HONEST_FEDBIS = 2.0  # the mean of 1, 2, 3 and the hostile client's honest-looking 2

FEDBIS_ATTACKS = {
    "no MetricRecord": _trained(None),
    "a metric key missing (the weight)": _trained(
        {k: v for k, v in HONEST_METRICS.items() if k != pref.NUM_EXAMPLES}
    ),
    "a NaN train loss": _trained({**HONEST_METRICS, "train-loss": float("nan")}),
    "num-examples 1e6 (declared 50)": _trained(
        {**HONEST_METRICS, pref.NUM_EXAMPLES: 1_000_000}, {"w": np.full(2, -100.0, np.float32)}
    ),
}


@pytest.mark.parametrize("attack", FEDBIS_ATTACKS)
def test_a_hostile_fedavg_reply_is_counted_and_the_model_is_the_honest_one(attack):
    model, rounds, faults = _fedbis(FEDBIS_ATTACKS[attack])
    np.testing.assert_allclose(model, (1.0 + 2.0 + 3.0) / 3, rtol=1e-6)
    assert all(faults[r]["malformed"] == 1 and faults[r]["accepted"] == HONEST for r in (1, 2))
    assert all(np.isfinite(v) for r in rounds.values() for v in r.values() if isinstance(v, float))


def test_an_extra_metric_key_costs_nothing_but_itself():
    """Flower's FedAvg raised on replies whose metric keys differ: an informational key only one
    reply carries is dropped from the exchange; the model is the honest one."""
    model, rounds, faults = _fedbis(_trained({**HONEST_METRICS, "extra": 1.0}))
    np.testing.assert_allclose(model, HONEST_FEDBIS, rtol=1e-6)
    assert faults[1]["accepted"] == HONEST + 1 and "extra" not in rounds[1]


def _fedbiscuit(train=None, report=None):
    """FedBiscuit with one selector: a warm-up round, then a regroup and a group round; the
    hostile client trains to 10 (a well-formed update: its weight decides how far it pulls)."""
    handlers = {n: _preference_client(n - 1, float(n)) for n in range(1, HONEST + 1)}
    handlers[HOSTILE] = _preference_client(HOSTILE - 1, 10.0, train=train, report=report)
    ctx = _preference_context(handlers)
    spec = OmegaConf.create(
        {"run": "fedsim_experiments.fedbiscuit.protocol.fedbiscuit", "num_selectors": 1}
    )
    out = fedbiscuit.fedbiscuit(ctx, "fedbiscuit_u1", spec)
    return out["selectors"][0]["w"], ctx.messenger.faults


def _report(losses, examples):
    return lambda msg: RecordDict(
        {
            pref.METRICS: MetricRecord(
                {f"{pref.LOSS_PREFIX}0": losses, pref.NUM_EXAMPLES: examples, pref.UNIT_WEIGHT: 1.0}
            )
        }
    )


@cache
def honest_selector() -> np.ndarray:
    return _fedbiscuit()[0]


@pytest.mark.parametrize(
    "attack, phase",
    [
        ("an update of the wrong shape", "train"),
        ("a list where a loss is expected", "regroup"),
        ("a regroup weight of 1e300 (declared 50)", "regroup"),
    ],
)
def test_a_hostile_fedbiscuit_reply_is_counted_and_the_selector_is_the_honest_one(attack, phase):
    train = (
        _trained(HONEST_METRICS, {"w": np.full(3, 2.0, np.float32)}) if "shape" in attack else None
    )
    report = {
        "a list where a loss is expected": _report([1.0, 1.0], EXAMPLES),
        "a regroup weight of 1e300 (declared 50)": _report(64.0, 1e300),
    }.get(attack)
    selector, faults = _fedbiscuit(train, report)
    if phase == "regroup":  # its update (to 10, well-formed) counts with the weight it declared
        np.testing.assert_allclose(selector, honest_selector(), rtol=1e-6)
    else:  # left out: eq. 6 of the honest clients' updates
        assert np.all(np.isfinite(selector)) and selector.shape == (2,)
    assert faults[f"fedbiscuit_u1/{phase}"][2]["malformed"] == 1


# --- discovery: a reply without its record, a partition claimed twice -------------------------


def test_a_discovery_reply_without_its_record_is_counted():
    handlers = {n: _preference_client(n - 1, 1.0) for n in range(1, HONEST + 1)}
    handlers[HOSTILE] = lambda msg: RecordDict({"nothing": ConfigRecord({})})
    with pytest.raises(PhaseFailed, match="discover round 1: 3 of 4"):
        _preference_context(handlers)


def test_a_node_claiming_another_nodes_partition_does_not_replace_it():
    """Node 4 claims partition 0 (node 1's) at discovery: it never takes node 1's place; both
    claims are refused and counted; discovery needs every client, so the run stops, naming them."""
    handlers = {n: _preference_client(n - 1, 1.0) for n in range(1, HONEST + 1)}
    handlers[HOSTILE] = _preference_client(0, 1.0)
    messenger = messenger_of(handlers)
    with pytest.raises(PhaseFailed, match="claim"):
        discover(messenger, {})
    assert messenger.faults["discover"][1]["duplicate"] == 2


def test_a_partition_claimed_twice_at_whoami_is_refused_and_the_run_goes_on():
    handlers = {n: _preference_client(n - 1, 1.0) for n in range(1, HONEST + 1)}
    for n in range(1, HONEST + 1):
        handlers[n] = _whoami(handlers[n], n - 1)
    handlers[HOSTILE] = _whoami(_preference_client(0, 1.0), 0)
    messenger = messenger_of(handlers, partitions=True)
    assert messenger.node_ids() == [2, 3]  # neither claimant of partition 0 is in the federation
    assert messenger.faults["whoami"][1]["duplicate"] == 2
    nodes, _ = discover(messenger, {})
    assert nodes == {1: 2, 2: 3}


class KeyedGrid(InProcessGrid):
    """A deployment's grid under SuperNode authentication: each node's public key is the one the
    SuperLink holds for it (Flower's ``GetNodes``: ``NodeInfo.public_key``, PEM as ``flwr supernode
    register`` stores it)."""

    def __init__(self, handlers: dict, keys: dict[int, bytes]):
        super().__init__(handlers)
        self.keys = keys

    def get_nodes(self):
        return [NodeInfo(node_id=n, public_key=self.keys[n]) for n in self.handlers]


def _registered(certs: Certificates, index: int) -> bytes:
    return public_key_to_bytes(load_ssh_public_key(certs.node_pub(index).read_bytes()))


def test_a_vacant_partition_is_refused_to_a_node_whose_key_is_another_partitions(
    tmp_path, monkeypatch
):
    """Under SuperNode authentication the launcher binds each partition to the key of the
    SuperNode it starts for it. Node 3 (partition 2) is down at whoami; node 4, whose key is
    partition 3's, claims partition 2: before, no other claim made it a duplicate and node 4 took
    it (a node of another key held partition 2's data role); now its claim is refused and
    counted, and partition 2 stays vacant. A key the launcher made for no SuperNode claims none."""
    certs = make_federation(tmp_path / "certs", ["127.0.0.1"], nodes=HOSTILE)
    monkeypatch.setenv(NODE_KEYS_ENV, partition_keys(certs, HOSTILE))
    stranger = make_federation(tmp_path / "others", ["127.0.0.1"], nodes=1)
    handlers = {n: _whoami(_preference_client(n - 1, 1.0), n - 1) for n in range(1, HONEST + 1)}
    handlers[3] = _down
    handlers[HOSTILE] = _whoami(_preference_client(2, 1.0), 2)
    handlers[5] = _whoami(
        _preference_client(4, 1.0), 4
    )  # a key of no SuperNode the launcher started
    keys = {n: _registered(certs, n - 1) for n in range(1, HOSTILE + 1)} | {
        5: _registered(stranger, 0)
    }
    messenger = Messenger(KeyedGrid(handlers, keys), timeout=5, know_partitions=True)
    assert messenger.partitions == {1: 0, 2: 1}
    counts = messenger.faults["whoami"][1]
    assert (counts["accepted"], counts["failed"], counts["malformed"], counts["duplicate"]) == (
        2,
        1,
        2,
        0,
    )


def test_the_logical_clients_of_key_bound_supernodes_tell_their_partitions(tmp_path, monkeypatch):
    """Many clients per SuperNode: the SuperNodes' claims are held to their keys; their logical
    clients (the ShardedGrid's, placed by the server) carry no key and keep theirs."""
    certs = make_federation(tmp_path / "certs", ["127.0.0.1"], nodes=2)
    monkeypatch.setenv(NODE_KEYS_ENV, partition_keys(certs, 2))
    hosts = supernodes(2).handlers
    grid = ShardedGrid(
        KeyedGrid(hosts, {n: _registered(certs, n - 100) for n in hosts}), 4, timeout=5, poll=0.0
    )
    assert Messenger(grid, timeout=5, know_partitions=True).partitions == {1: 0, 2: 1, 3: 2, 4: 3}


def test_a_logical_client_claiming_a_vacant_partition_of_another_supernode_is_refused(
    tmp_path, monkeypatch
):
    """Many clients per SuperNode, under SuperNode authentication: SuperNode 100 hosts logical
    clients 0 and 2, SuperNode 101 clients 1 and 3, and client 3 fails at whoami. SuperNode 100
    answers its client 2's whoami with partition 3: before, no other claim made it a duplicate
    and the node the server placed as client 2 took partition 3 (the finding the key binding
    closed, one level down); the server placed every logical client, so a claim of any other
    partition than its own is refused and counted, and partition 3 stays vacant."""
    certs = make_federation(tmp_path / "certs", ["127.0.0.1"], nodes=2)
    monkeypatch.setenv(NODE_KEYS_ENV, partition_keys(certs, 2))
    hosts = supernodes(2).handlers

    def tamper(p, handle):
        def answer(msg):
            packed = handle(msg)
            if (
                SHARD not in msg.content
                or WHOAMI not in json.loads(msg.content[SHARD][LAYOUT])["records"][0]
            ):
                return packed  # the SuperNodes' own whoami
            layout = json.loads(packed[SHARD][LAYOUT])
            if p == 0:  # its second client, logical 2, claims partition 3
                packed[layout["records"][1][WHOAMI]][PARTITION_ID] = 3
            else:  # its second client, logical 3, fails
                layout["errors"]["1"] = "client 3 failed"
                packed[SHARD][LAYOUT] = json.dumps(layout)
            return packed

        return answer

    keys = {n: _registered(certs, n - 100) for n in hosts}
    grid = KeyedGrid({n: tamper(n - 100, h) for n, h in hosts.items()}, keys)
    messenger = Messenger(
        ShardedGrid(grid, 4, timeout=5, poll=0.0), timeout=5, know_partitions=True
    )
    assert messenger.partitions == {1: 0, 2: 1}
    counts = messenger.faults["whoami"][1]
    assert (counts["accepted"], counts["failed"], counts["malformed"]) == (2, 1, 1)


def _down(msg):
    raise RuntimeError("this SuperNode is down")


def test_the_ray_nodes_a_whoami_names_are_counted_and_anything_else_there_is_left_out():
    """The results' provenance counts the clients per Ray node from the whoami replies; a node
    naming no hex id (a path, a 10,000-character string, a number) still joins the run, uncounted."""
    named = {1: "ab" * 28, 2: "ab" * 28, 3: "cd" * 28, 4: "../../etc", 5: "a" * 10_000, 6: 7}

    def node(n: int):
        return lambda msg: RecordDict(
            {WHOAMI: ConfigRecord({PARTITION_ID: n - 1, RAY_NODE: named[n]})}
        )

    messenger = messenger_of({n: node(n) for n in named}, partitions=True)
    assert messenger.node_ids() == list(named)
    assert messenger.ray_nodes == {"ab" * 28: 2, "cd" * 28: 1}


def test_a_node_claiming_at_discovery_another_partition_than_it_told_at_whoami_is_refused():
    """Node 4 tells partition 3 at whoami, then claims partition 0 (node 1's) at discovery: the
    Messenger's map is the one source of a node's partition, so its reply is refused (malformed,
    not a duplicate of node 1's: node 1 keeps its place), and discovery, which needs every client,
    stops naming the mismatch."""
    handlers = {n: _whoami(_preference_client(n - 1, 1.0), n - 1) for n in range(1, HONEST + 1)}
    handlers[HOSTILE] = _whoami(_preference_client(0, 1.0), HOSTILE - 1)
    messenger = messenger_of(handlers, partitions=True)
    with pytest.raises(PhaseFailed, match="claims partition 0, told 3 at whoami"):
        discover(messenger, {}, pref.discover_reply(messenger.partition_of, None, HOSTILE))
    assert (
        messenger.faults["discover"][1]["malformed"],
        messenger.faults["discover"][1]["duplicate"],
    ) == (1, 0)


def _whoami(handler, partition: int):
    def handle(msg):
        if WHOAMI in msg.content.config_records:
            return RecordDict({WHOAMI: ConfigRecord({PARTITION_ID: partition})})
        return handler(msg)

    return handle


# --- FedE4RAG under HE: the weight, the ciphertexts --------------------------------------------


class HEVectorClient(VectorClient):
    """A FedE4RAG node under HE: the ClientApp's HE layer around a retriever stand-in that answers
    discovery as ``fedsim_clients/retriever.py`` does and trains to its vector, which the layer
    sends encrypted in the reply (one trip) or keeps for the chunk phases; ``hostile`` rewrites
    what the node sends back to a train message."""

    def __init__(
        self, tmp_path, partition: int, vector: np.ndarray, pairs: int, hostile=None, key_dir=None
    ):
        super().__init__(key_dir or tmp_path / "keys", tmp_path / "state", partition, vector, pairs)
        self.hostile = hostile

    def __call__(self, msg):
        reply = super().__call__(msg)
        return (
            self.hostile(reply)
            if self.hostile and msg.metadata.message_type == MessageType.TRAIN
            else reply
        )

    def handle(self, msg):
        if msg.metadata.message_type == MessageType.QUERY:
            return RecordDict(
                {
                    rag.INFO: ConfigRecord(
                        {
                            rag.PARTITION_ID: self.partition_id,
                            rag.NUM_PAIRS: self.examples,
                            rag.DOCUMENTS: ["d"],
                            rag.COMPANIES: ["c"],
                        }
                    )
                }
            )
        return super().handle(msg)


def _he_run(tmp_path, hostile=None):
    cfg = compose(
        [
            "experiment=fede4rag_paper",
            DATA,
            "num_rounds=1",
            f"task.he.key_dir={tmp_path / 'keys'}",
            "protocol.he_chunk_floats=4096",
        ]
    )
    rng = np.random.default_rng(0)
    vectors = [rng.normal(size=100) for _ in range(HOSTILE)]
    clients = {
        n: HEVectorClient(tmp_path, n - 1, vectors[n - 1], 50, hostile if n == HOSTILE else None)
        for n in range(1, HOSTILE + 1)
    }
    messenger = messenger_of(clients)
    ctx = fede4rag.Context(
        messenger,
        cfg,
        client_config(cfg),
        *fede4rag._discover(messenger, client_config(cfg)),
        budget=1,
        plan=PrivacyPlan.fresh(cfg),
    )
    spec = OmegaConf.create(
        {"run": "fedsim_experiments.fede4rag.protocol.federated", "he": True, "kd_weight": 0.0}
    )
    fede4rag.federated(ctx, "fede4rag", spec)
    return clients[1].he.global_weights(1), vectors, messenger.faults["fede4rag/train"][1]


def _weight(weight):
    def hostile(reply):
        reply[he_keys.METRICS] = MetricRecord({**reply[he_keys.METRICS], rag.NUM_EXAMPLES: weight})
        return reply

    return hostile


def _renamed(reply):
    record = reply[he_keys.CIPHERTEXTS]
    reply[he_keys.CIPHERTEXTS] = ArrayRecord({f"x-{k}": v for k, v in record.items()})
    return reply


def _garbage(reply):
    record = reply[he_keys.CIPHERTEXTS]
    size = record[he_keys.CIPHERTEXT_BYTES].shape[0]
    reply[he_keys.CIPHERTEXTS] = ArrayRecord(
        {**record, he_keys.CIPHERTEXT_BYTES: Array(np.full(size, 7, np.uint8))}
    )
    return reply


def _shifted_lengths(reply):
    """Lengths that still add up to the bytes but cut the ciphertexts in the wrong places."""
    record = reply[he_keys.CIPHERTEXTS]
    lengths = record[he_keys.CIPHERTEXT_LENGTHS].numpy().copy()
    lengths[0], lengths[-1] = lengths[0] - 1, lengths[-1] + 1
    reply[he_keys.CIPHERTEXTS] = ArrayRecord({**record, he_keys.CIPHERTEXT_LENGTHS: Array(lengths)})
    return reply


def _kept(reply):
    """The update not sent inline though it fits (the fuzzer found it): every node was sent to the
    chunk phase for an update none of them kept."""
    del reply[he_keys.CIPHERTEXTS]
    return reply


@pytest.mark.parametrize(
    "hostile",
    [_weight(1e12), _renamed, _garbage, _shifted_lengths, _kept],
    ids=[
        "weight 1e12 (declared 50)",
        "renamed ciphertexts",
        "undecodable ciphertexts",
        "ciphertexts cut in the wrong places",
        "no inline update",
    ],
)
def test_a_hostile_he_reply_is_counted_and_the_aggregate_is_the_honest_one(tmp_path, hostile):
    installed, vectors, faults = _he_run(tmp_path, hostile)
    np.testing.assert_allclose(installed, np.mean(vectors[:HONEST], axis=0), atol=1e-4)
    assert faults["malformed"] == 1 and faults["accepted"] == HONEST


OVERSIZED = (
    8 << 20
)  # bytes added: ~25x a ciphertext under the task's N 8192 (the finding: one of 256 MiB was parsed)


def _oversized_ciphertext(reply):
    """The last ciphertext grown by OVERSIZED zero bytes, its length to match: a well-cut record."""
    record = reply[he_keys.CIPHERTEXTS]
    data, lengths = (
        record[he_keys.CIPHERTEXT_BYTES].numpy(),
        record[he_keys.CIPHERTEXT_LENGTHS].numpy().copy(),
    )
    lengths[-1] += OVERSIZED
    reply[he_keys.CIPHERTEXTS] = ArrayRecord(
        {
            he_keys.CIPHERTEXT_BYTES: Array(np.concatenate([data, np.zeros(OVERSIZED, np.uint8)])),
            he_keys.CIPHERTEXT_LENGTHS: Array(lengths),
        }
    )
    return reply


def _oversized_context(reply):
    public = reply[he_keys.CONTEXT][he_keys.PUBLIC_CONTEXT]
    reply[he_keys.CONTEXT] = ConfigRecord({he_keys.PUBLIC_CONTEXT: public + bytes(OVERSIZED)})
    return reply


@pytest.mark.parametrize(
    "hostile",
    [_oversized_ciphertext, _oversized_context],
    ids=["a ciphertext of 8 MiB", "a public context of 8 MiB"],
)
def test_an_oversized_he_reply_is_counted_before_tenseal_reads_it(tmp_path, monkeypatch, hostile):
    """What TenSEAL parses from a client is capped by the run's CKKS parameters (N 8192 with
    moduli 60-40-40-60: a ciphertext well under 0.5 MB, a public context just over) before it parses
    it: an 8 MiB one is counted malformed unread (before, TenSEAL parsed whatever size came)."""
    parsed = []

    def spying(parse):
        def spy(*args, **kwargs):
            parsed.append(max(len(a) for a in args if isinstance(a, bytes)))
            return parse(*args, **kwargs)

        return spy

    for name in ("ckks_vector_from", "context_from"):
        monkeypatch.setattr(tenseal, name, spying(getattr(tenseal, name)))
    installed, vectors, faults = _he_run(tmp_path, hostile)
    np.testing.assert_allclose(installed, np.mean(vectors[:HONEST], axis=0), atol=1e-4)
    assert faults["malformed"] == 1 and faults["accepted"] == HONEST
    assert parsed and max(parsed) < OVERSIZED


# --- many clients per SuperNode: the batch manifest --------------------------------------------


def _nested(packed):
    packed[SHARD][LAYOUT] = "[" * 100_000 + "]" * 100_000
    return packed


def test_a_deeply_nested_batch_manifest_is_counted_not_a_recursion_error():
    grid = ShardedGrid(
        tampering_supernodes(3, lambda p, packed: _nested(packed) if p == 1 else packed),
        12,
        timeout=60.0,
        poll=0.0,
    )
    messenger = Messenger(grid, 60.0, poll_seconds=0.0)
    messenger.exchange(
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
    assert (
        messenger.faults["probe"][1]["malformed"] == 4
        and messenger.faults["probe"][1]["accepted"] == 8
    )
