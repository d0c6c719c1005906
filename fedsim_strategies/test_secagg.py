"""SecAgg+ through the messaging path: the unmasked mean is FedAvg's within the stated
quantization bound with clients dropping at every stage, what a malformed reply costs (counted,
left out, the round completes; a clear failure when too few remain), and a sum-only strategy
with a server step (FedAdam) on the unmasked mean. Clients are served as the ClientApp serves
them, through the SecAgg layer around a handler (``fedsim/runtime/secagg_layer.py``)."""

import json

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg

from fedsim.config import node_local
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.privacy.secagg import messages as keys
from fedsim.privacy.secagg import wire
from fedsim.runtime import client_state
from fedsim.runtime.client_app import SEED_KEY
from fedsim.runtime.client_state import RUN_KEY
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger, PhaseFailed
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.secagg_layer import STATE_FILE, SecAggLayer
from fedsim_strategies.secagg import SecAggPlus

SIZE = 50


class VectorNode:
    """One node through the SecAgg layer; its 'training' returns a fixed vector. ``drop``: the
    stage at which it stops answering (its messages time out); ``corrupt``: a function that
    spoils its reply to one stage (a malformed ciphertext, share or masked vector)."""

    def __init__(self, state_dir, partition_id, vector, examples, drop=None, corrupt=None):
        self.node = {"state-dir": str(state_dir)}
        self.vector, self.examples, self.drop = vector, examples, drop
        self.corrupt = corrupt or {}
        self.layer = SecAggLayer(self, partition_id)

    def __call__(self, msg):
        node_local.attach(msg, self.node)
        op = msg.content[keys.CONFIG].get(keys.OP)
        if op == self.drop:
            return None
        reply = self.layer.handle(msg)
        if op in self.corrupt:
            self.corrupt[op](reply)
        return reply

    def handle(self, msg):
        return RecordDict(
            {
                ARRAYS: to_record({"w": self.vector}),
                METRICS: MetricRecord({NUM_EXAMPLES: self.examples, "loss": 1.0}),
            }
        )


def federation(tmp_path, n, drops=None, corrupt=None, seed=0):
    rng = np.random.default_rng(seed)
    vectors = [rng.normal(size=SIZE) for _ in range(n)]
    examples = [int(e) for e in rng.integers(5, 50, n)]
    nodes = {
        i + 1: VectorNode(
            tmp_path,
            i,
            vectors[i],
            examples[i],
            (drops or {}).get(i + 1),
            (corrupt or {}).get(i + 1),
        )
        for i in range(n)
    }
    return nodes, vectors, examples


def secure_fedavg(nodes, strategy=None, rounds=1, **settings):
    messenger = Messenger(InProcessGrid(nodes), timeout=0.05, poll_seconds=0.001)
    secagg = SecAggPlus(strategy or FedAvg(fraction_evaluate=0.0), max_weight=100.0, **settings)
    result = secagg.start(
        messenger.grid("fl"),
        to_record({"w": np.zeros(SIZE)}),
        rounds,
        30,
        ConfigRecord({SEED_KEY: 3, RUN_KEY: "secagg-test"}),
    )
    return from_record(result.arrays)["w"], secagg, messenger


def plain_mean(vectors, examples, included):
    total = sum(examples[i - 1] for i in included)
    return sum(examples[i - 1] * vectors[i - 1] for i in included) / total


def test_mean_with_dropouts_at_each_stage_within_the_stated_bound(tmp_path):
    """Nodes 2 and 3 drop before masking (their pairwise masks are removed with their
    reconstructed keys), 4 and 5 after sending masked inputs (summed, their seeds rebuilt from
    their neighbours' shares)."""
    drops = {2: keys.MASK, 3: keys.SHARE, 4: keys.CHECK, 5: keys.UNMASK}
    nodes, vectors, examples = federation(tmp_path, 12, drops)
    mean, secagg, messenger = secure_fedavg(nodes)
    figures = secagg.rounds[1]
    assert figures["secagg-live"] == 10 and figures["secagg-dropped"] == 1  # 3 never shared
    want = plain_mean(vectors, examples, [i for i in nodes if i not in (2, 3)])
    assert np.abs(mean - want).max() <= figures["secagg-error-bound"]
    assert figures["secagg-error-bound"] < 1e-6
    assert messenger.faults["fl/train"][1]["timed_out"] == 1


def test_sparse_graph_secagg_plus(tmp_path):
    """SecAgg+: 30 nodes, each with 8 neighbours (t = 5), three dropping after their masked
    inputs went in."""
    drops = {10: keys.CHECK, 20: keys.UNMASK, 30: keys.UNMASK}
    nodes, vectors, examples = federation(tmp_path, 30, drops)
    mean, secagg, _ = secure_fedavg(nodes, degree=8)
    assert (
        np.abs(mean - plain_mean(vectors, examples, nodes)).max()
        <= (secagg.rounds[1]["secagg-error-bound"])
    )


def test_malformed_ciphertext_counted_and_its_sender_left_out(tmp_path):
    """Node 1 spoils the ciphertext it sends its first neighbour: that neighbour leaves node 1's
    pairwise mask out; the server counts the share malformed, sums without node 1 (removing its
    masks with the others) and the round completes."""

    def spoil(reply):
        record = reply[keys.CONFIG]
        tokens = wire.unpack_blobs(record[keys.CIPHERTEXTS])
        tokens[0] = tokens[0][:-8] + b"AAAAAAAA"
        record[keys.CIPHERTEXTS] = wire.blobs(tokens)

    nodes, vectors, examples = federation(tmp_path, 8, corrupt={1: {keys.SHARE: spoil}})
    mean, secagg, messenger = secure_fedavg(nodes)
    assert messenger.faults["fl/secagg-share"][1]["malformed"] == 1
    want = plain_mean(vectors, examples, range(2, 9))
    assert np.abs(mean - want).max() <= secagg.rounds[1]["secagg-error-bound"]


def test_packed_ciphertexts_that_do_not_unpack_count_malformed(tmp_path):
    """Node 3's share reply packs its ciphertexts with a length that does not add up (one byte
    cut off): the reply is counted malformed, node 3 never shared, and the round sums the rest."""

    def cut(reply):
        record = reply[keys.CONFIG]
        record[keys.CIPHERTEXTS] = record[keys.CIPHERTEXTS][:-1]

    nodes, vectors, examples = federation(tmp_path, 8, corrupt={3: {keys.SHARE: cut}})
    mean, secagg, messenger = secure_fedavg(nodes)
    assert messenger.faults["fl/secagg-share"][1]["malformed"] == 1
    assert secagg.rounds[1]["secagg-live"] == 7
    want = plain_mean(vectors, examples, [i for i in nodes if i != 3])
    assert np.abs(mean - want).max() <= secagg.rounds[1]["secagg-error-bound"]


def test_malformed_share_at_unmask_counted_round_completes(tmp_path):
    """A share that does not match the hash its owner sent is counted malformed and not used;
    the other neighbours' shares suffice."""

    def spoil(reply):
        record = reply[keys.CONFIG]
        shares = wire.unpack_blobs(record[keys.SHARES])
        record[keys.SHARES] = wire.blobs(s[:-1] + bytes([s[-1] ^ 1]) for s in shares)

    nodes, vectors, examples = federation(tmp_path, 8, corrupt={4: {keys.UNMASK: spoil}})
    mean, secagg, messenger = secure_fedavg(nodes)
    assert messenger.faults["fl/secagg-unmask"][1]["malformed"] == 1
    want = plain_mean(vectors, examples, nodes)
    assert np.abs(mean - want).max() <= secagg.rounds[1]["secagg-error-bound"]


def test_malformed_masked_vector_counted_and_unmasked_as_dropped(tmp_path):
    def spoil(content):
        vector = content[keys.MASKED][keys.VECTOR].numpy()
        content[keys.MASKED] = to_record({keys.VECTOR: vector[:-1]})

    nodes, vectors, examples = federation(tmp_path, 8, corrupt={6: {keys.MASK: spoil}})
    mean, secagg, messenger = secure_fedavg(nodes)
    assert messenger.faults["fl/train"][1]["malformed"] == 1
    want = plain_mean(vectors, examples, [i for i in nodes if i != 6])
    assert np.abs(mean - want).max() <= secagg.rounds[1]["secagg-error-bound"]


def test_too_few_valid_shares_fail_the_round_clearly(tmp_path):
    """With 5 nodes (t = 3) and three spoiling their unmask shares, a live node's seed cannot be
    rebuilt: the run stops naming the round and the node, not with a wrong sum."""

    def spoil(reply):
        record = reply[keys.CONFIG]
        shares = wire.unpack_blobs(record[keys.SHARES])
        record[keys.SHARES] = wire.blobs(s[:-1] + bytes([s[-1] ^ 1]) for s in shares)

    corrupt = {n: {keys.UNMASK: spoil} for n in (1, 2, 3)}
    nodes, _, _ = federation(tmp_path, 5, corrupt=corrupt)
    with pytest.raises(PhaseFailed, match=r"secagg round 1: node \d: 2 shares came back, t=3"):
        secure_fedavg(nodes)


def test_sum_only_strategy_with_a_server_step_runs_on_the_unmasked_mean(tmp_path):
    """FedAdam under SecAgg+ steps from the unmasked mean: its model is plaintext FedAdam's."""
    nodes, vectors, examples = federation(tmp_path, 6)
    secure, secagg, _ = secure_fedavg(nodes, FedAdam(fraction_evaluate=0.0), rounds=2)
    plain_nodes = {n: node.handle for n, node in nodes.items()}
    messenger = Messenger(InProcessGrid(plain_nodes), timeout=1, poll_seconds=0.001)
    plain = FedAdam(fraction_evaluate=0.0).start(
        messenger.grid("fl"), to_record({"w": np.zeros(SIZE)}), 2, 30, ConfigRecord({})
    )
    bound = max(r["secagg-error-bound"] for r in secagg.rounds.values())
    # Adam's step is 1e-1 / (sqrt(v) + 1e-9) per unit of the mean's change: scale the bound by it
    assert np.abs(secure - from_record(plain.arrays)["w"]).max() < 1e-3
    assert bound < 1e-6


def test_a_completed_round_leaves_no_secret_on_the_clients_disk(tmp_path):
    """The attack: who reads a client's state folder after its round (a run that keeps client
    state, or one killed before its clients forget it) gets, with the server's copy of the
    masked input, the client's seed and mask key (its update) and both shares of every
    neighbour's seed and key. A client that answered the unmask keeps none of them."""
    nodes, _, _ = federation(tmp_path, 5)
    secure_fedavg(nodes)
    states = [json.loads(f.read_text()) for f in tmp_path.rglob("secagg-round.json")]
    assert len(states) == 5 and {s["stage"] for s in states} == {"unmask"}
    for state in states:
        assert state["secrets"] == state["seed_shares"] == state["key_shares"] == {}
        # what is left are the fresh keys of its next round, sent with its unmask reply
        assert set(state["ahead"]["public"].values()).isdisjoint(state["public"].values())


def test_keys_sent_with_the_unmask_reply_spare_the_next_rounds_key_exchange(tmp_path):
    """A node that answers a round's unmask sends its next round's keys with it: rounds 2 and 3
    ask only node 6 (which drops at every unmask) for keys, and sum all 8 as round 1 did."""
    nodes, vectors, examples = federation(tmp_path, 8, {6: keys.UNMASK})
    mean, secagg, messenger = secure_fedavg(nodes, rounds=3)
    asked = {r: row["accepted"] for r, row in messenger.faults["fl/secagg-keys"].items()}
    assert asked == {1: 8, 2: 1, 3: 1}
    assert [secagg.rounds[r]["secagg-live"] for r in (1, 2, 3)] == [8, 8, 8]
    want = plain_mean(vectors, examples, nodes)
    assert np.abs(mean - want).max() <= secagg.rounds[3]["secagg-error-bound"]


class ForgetfulNode(VectorNode):
    """A node whose state folder is wiped after round 1 (a SuperNode back on a fresh disk)."""

    def __call__(self, msg):
        reply = super().__call__(msg)
        config = msg.content[keys.CONFIG]
        if config.get(keys.OP) == keys.UNMASK and config[keys.ROUND] == 1:
            (client_state.of(msg, self.layer.partition_id).folder / STATE_FILE).unlink()
        return reply


def test_a_node_that_lost_its_keys_sent_ahead_misses_one_round_not_the_run(tmp_path):
    """The server asks node 3 to share under the keys it sent ahead, which node 3 no longer
    holds: node 3 refuses (counted), round 2 sums the other 7, and round 3 asks node 3 for
    fresh keys and sums all 8 again."""
    nodes, vectors, examples = federation(tmp_path, 8)
    old = nodes[3]
    nodes[3] = ForgetfulNode(tmp_path, 2, old.vector, old.examples)
    _, secagg, messenger = secure_fedavg(nodes, rounds=3)
    assert messenger.faults["fl/secagg-share"][2]["failed"] == 1
    assert [secagg.rounds[r]["secagg-live"] for r in (1, 2, 3)] == [8, 7, 8]
    assert messenger.faults["fl/secagg-keys"][3]["accepted"] == 1


def test_a_node_that_sends_anothers_keys_for_its_next_round_is_left_out_with_it(tmp_path):
    """The attack: node 2 sends node 1's keys for the next round as its own. A neighbourhood
    holding a key twice is refused by every honest neighbour (``protocol.share``), which would
    stop round 2 for all; the server leaves both out of round 2 (counted ``duplicate``) and
    sums the other 6."""
    sent = {}

    def keep(reply):
        sent.update({k: reply[keys.CONFIG][k] for k in keys.KEY_TRIO})

    def copy(reply):
        for k in keys.KEY_TRIO:
            reply[keys.CONFIG][k] = sent[k]

    corrupt = {1: {keys.UNMASK: keep}, 2: {keys.UNMASK: copy}}
    nodes, vectors, examples = federation(tmp_path, 8, corrupt=corrupt)
    mean, secagg, messenger = secure_fedavg(nodes, rounds=2)
    assert messenger.faults["fl/secagg-keys"][2]["duplicate"] == 2
    assert secagg.rounds[2]["secagg-live"] == 6
    want = plain_mean(vectors, examples, range(3, 9))
    assert np.abs(mean - want).max() <= secagg.rounds[2]["secagg-error-bound"]


def test_unparsable_keys_for_the_next_round_make_the_unmask_reply_malformed(tmp_path):
    """Node 5's unmask reply carries a next-round key that is no EC public key: the reply is
    counted malformed (its shares unused, the others suffice) and nothing of it is kept."""

    def spoil(reply):
        reply[keys.CONFIG][keys.SIGN_KEYS] = b"-----BEGIN PUBLIC KEY-----\nnot a key"

    nodes, vectors, examples = federation(tmp_path, 8, corrupt={5: {keys.UNMASK: spoil}})
    mean, secagg, messenger = secure_fedavg(nodes)
    assert messenger.faults["fl/secagg-unmask"][1]["malformed"] == 1
    assert 5 not in secagg.ahead and len(secagg.ahead) == 7
    want = plain_mean(vectors, examples, nodes)
    assert np.abs(mean - want).max() <= secagg.rounds[1]["secagg-error-bound"]


def test_a_masked_weight_other_than_the_reported_one_fails_the_round(tmp_path):
    """The attack: a client masks a weight level other than the ``num-examples`` it reports in
    plaintext (masks are additive: adding to the first value of its masked vector adds to its
    weight). Its reply is well-formed, so the mean would silently be off by the weight it made
    up; the server compares the unmasked weight sum with the reported one and stops the round."""

    def inflate(content):
        vector = content[keys.MASKED][keys.VECTOR].numpy().copy()
        vector[0] += np.uint32(2**20)
        content[keys.MASKED] = to_record({keys.VECTOR: vector})

    nodes, _, _ = federation(tmp_path, 6, corrupt={2: {keys.MASK: inflate}})
    with pytest.raises(PhaseFailed, match="masked weights sum to .* reported"):
        secure_fedavg(nodes)


def test_two_mask_requests_at_once_get_one_masked_input(tmp_path):
    """The attack: a server sends one node two train messages (two models) at once. Flower's
    simulation serves a node's messages on several workers and a SuperNode may run several
    ClientApp processes, so both could read the round's state at stage 'share' and mask two
    updates under the same masks: their difference, unmasked, is the difference of the two
    updates, and with one model known the other. The layer serves one stage of a node at a
    time: the second request finds the round masked and is refused."""
    import threading

    arrived = threading.Barrier(2, timeout=2)

    class Trainer:
        def handle(self, msg):
            try:
                arrived.wait()  # both requests are past the stage check (without the lock)
            except threading.BrokenBarrierError:
                pass  # the other waits for this one: served one at a time
            trained = from_record(msg.content[ARRAYS])["w"] + 1.0
            return RecordDict(
                {ARRAYS: to_record({"w": trained}), METRICS: MetricRecord({NUM_EXAMPLES: 10})}
            )

    layers = {n: SecAggLayer(Trainer(), n - 1) for n in (1, 2, 3)}

    def ask(node, config, arrays=None, kind=MessageType.QUERY):
        content = RecordDict({keys.CONFIG: ConfigRecord({RUN_KEY: "race", **config})})
        if arrays is not None:
            content[ARRAYS] = to_record({"w": arrays})
        msg = Message(content, dst_node_id=node, message_type=kind)
        node_local.attach(msg, {"state-dir": str(tmp_path)})
        return layers[node].handle(msg)[keys.CONFIG]

    public = {n: ask(n, {keys.OP: keys.ADVERTISE, keys.ROUND: 1, keys.SELF: n}) for n in layers}
    hood = {keys.IDS: wire.ids([1, 2, 3]), keys.THRESHOLD: 2}
    for name in (keys.MASK_KEYS, keys.SHARE_KEYS, keys.SIGN_KEYS):
        hood[name] = wire.blobs(public[n][name] for n in layers)
    tokens = {}
    for n in layers:
        shared = ask(n, {keys.OP: keys.SHARE, keys.ROUND: 1, **hood})
        tokens.update(
            {
                (n, d): t
                for d, t in zip(
                    wire.unpack_ids(shared[keys.DESTINATIONS]),
                    wire.unpack_blobs(shared[keys.CIPHERTEXTS]),
                )
            }
        )
    mask = {
        keys.OP: keys.MASK,
        keys.ROUND: 1,
        keys.SOURCES: wire.ids([2, 3]),
        keys.CIPHERTEXTS: wire.blobs([tokens[(2, 1)], tokens[(3, 1)]]),
        keys.CLIP: 4.0,
        keys.LEVELS: 1000,
        keys.MAX_WEIGHT: 100.0,
        keys.WEIGHT_KEY: NUM_EXAMPLES,
    }
    outcomes = []

    def train(model):
        try:
            outcomes.append(ask(1, mask, np.full(SIZE, model), MessageType.TRAIN))
        except Exception as exc:  # noqa: BLE001 - the refusal is the outcome looked for
            outcomes.append(exc)

    threads = [threading.Thread(target=train, args=(m,)) for m in (0.0, 1.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(refused) == 1 and "at stage 'mask', not 'share'" in str(refused[0]), outcomes
