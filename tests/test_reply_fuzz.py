"""The reply fuzzer (issue 36): every phase of every method, run by the protocol's own phase code
over honest fake clients and one hostile node whose replies Hypothesis makes, mostly by mutating
the honest reply it would have sent (records dropped, added, renamed or of another kind; keys
dropped, added or given values of any type: NaN, 1e300, lists, strings, bytes; arrays of other
shapes and dtypes, strings, NaN). Whatever the hostile node sends:

- nothing raises out of the phase but the quorum's ``PhaseFailed`` of a phase that needs every
  node (discovery, a single node's work), and only when the reply was refused;
- every reply is counted once (``sent`` = failed + malformed + duplicate + timed out + accepted);
- a refused reply leaves the result exactly as the honest clients make it; an accepted one leaves
  it finite and within the phase's bounds (a prior on the simplex, a model in the hull of the
  updates averaged, retrieval scores in [0, 1]).

Profiles: ``replies-fast`` (a few examples per phase, derandomized: the fast loop) and
``replies-long`` (``slow``)."""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from omegaconf import OmegaConf
from test_reply_attacks import (
    DATA,
    DIM,
    EXAMPLES,
    HOSTILE,
    HEVectorClient,
    _fedtp_context,
    _preference_client,
    _preference_context,
    _whoami,
)
from test_sharded_grid import tampering_supernodes

from fedsim.config.compose import compose
from fedsim.privacy.plan import PrivacyPlan
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.journal import WHOAMI
from fedsim.runtime.messaging import ANY, Messenger, PhaseFailed, Policy
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.server_app import seed_server
from fedsim.runtime.sharded_grid import ShardedGrid
from fedsim_clients import feddtre_messages as dtre
from fedsim_clients import fede4rag_messages as rag
from fedsim_clients import fedtp_messages as tp
from fedsim_clients import preference_messages as pref
from fedsim_clients.topic_preference import hosted_rows
from fedsim_experiments.common import discover
from fedsim_experiments.fedbiscuit import protocol as fedbiscuit
from fedsim_experiments.feddtre import protocol as feddtre
from fedsim_experiments.feddtre import report as feddtre_report
from fedsim_experiments.fede4rag import protocol as fede4rag
from fedsim_experiments.fedtp import protocol as fedtp
from fedsim_tasks.financebench_rag.retrieval import METRICS as RETRIEVAL
from fedsim_tasks.financebench_rag.retrieval import weights_key

PROFILES = {"replies-fast": 6, "replies-long": 200}
for _name, _examples in PROFILES.items():
    settings.register_profile(
        _name,
        max_examples=_examples,
        deadline=None,
        derandomize=_name == "replies-fast",
        database=None,
        suppress_health_check=list(HealthCheck),
    )
PROFILE = [
    pytest.param("replies-fast"),
    pytest.param("replies-long", marks=[pytest.mark.slow, pytest.mark.exhaustive]),
]

# --- hostile replies ------------------------------------------------------------------------

INT64 = st.integers(-(2**63), 2**63 - 1)
FLOAT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, 0.5, 1e6, 1e12, 1e300, -1e300, math.nan, math.inf]),
)
NUMBER = st.one_of(FLOAT, INT64, st.sampled_from([0, 1, -1, 2, 10**6, 2**62]))
METRIC = st.one_of(NUMBER, st.lists(FLOAT, max_size=4), st.lists(INT64, max_size=4))
CONFIG = st.one_of(
    st.text(max_size=12),
    NUMBER,
    st.booleans(),
    st.binary(max_size=32),
    st.lists(st.text(max_size=8), max_size=3),
    st.lists(INT64, max_size=3),
    st.lists(FLOAT, max_size=3),
    st.lists(st.booleans(), max_size=3),
)
ARRAY = hnp.arrays(
    st.sampled_from(["float32", "float64", "int64", "uint8", "bool", "<U3", "complex128"]),
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
)
KINDS = ("metric", "config", "array")
VALUES = {"metric": METRIC, "config": CONFIG, "array": ARRAY}


def _records(content: RecordDict) -> list[list]:
    """``content`` as [name, kind, {key: value}] (arrays decoded), to mutate."""
    out = []
    for name, record in content.items():
        kind = (
            "metric"
            if name in content.metric_records
            else "config"
            if name in content.config_records
            else "array"
        )
        out.append(
            [name, kind, {k: v.numpy() if kind == "array" else v for k, v in record.items()}]
        )
    return out


def _record(kind: str, values: dict):
    if kind == "metric":
        return MetricRecord(values)
    if kind == "config":
        return ConfigRecord(values)
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in values.items()})


@st.composite
def hostile(draw, honest: RecordDict) -> RecordDict:
    """``honest`` with one to three mutations, or now and then something else altogether."""
    records = _records(honest)
    names = [r[0] for r in records] + ["extra", "metrics", "arrays", "config", "info"]
    keys = sorted({k for r in records for k in r[2]} | {"num-examples", "extra", "partition-id"})
    for _ in range(draw(st.integers(1, 3))):
        op = draw(
            st.sampled_from(
                ["drop", "add", "kind", "drop-key", "add-key", "value", "scale", "array"]
            )
        )
        record = draw(st.sampled_from(records)) if records else None
        if op == "drop" and records:
            records.remove(record)
        elif op == "add" or record is None:
            kind = draw(st.sampled_from(KINDS))
            records.append(
                [
                    draw(st.sampled_from(names)),
                    kind,
                    draw(st.dictionaries(st.sampled_from(keys), VALUES[kind], max_size=3)),
                ]
            )
        elif op == "kind":
            record[1] = draw(st.sampled_from(KINDS))
            record[2] = draw(st.dictionaries(st.sampled_from(keys), VALUES[record[1]], max_size=3))
        elif op == "drop-key" and record[2]:
            del record[2][draw(st.sampled_from(sorted(record[2])))]
        elif op in ("add-key", "value") or not record[2]:
            key = draw(st.sampled_from(sorted(record[2]) if op == "value" and record[2] else keys))
            record[2][key] = draw(VALUES[record[1]])
        else:
            key = draw(st.sampled_from(sorted(record[2])))
            record[2][key] = _scaled(draw, record[2][key], record[1])
    out = RecordDict()
    for name, kind, values in records:
        try:
            out[name] = _record(kind, values)
        except (TypeError, ValueError):  # a record Flower cannot hold cannot be sent either
            continue
    return out


def _scaled(draw, value, kind: str):
    """``value`` kept in shape but moved: an array of its shape with wild values, a number times
    a factor that breaks a bound."""
    factor = draw(st.sampled_from([-1.0, 0.0, 1e6, 1e300, math.nan, math.inf]))
    if kind == "array" and isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return draw(
            hnp.arrays(
                value.dtype,
                value.shape,
                elements=FLOAT.filter(
                    lambda x: np.isnan(x) or np.isinf(x) or abs(x) < np.finfo(value.dtype).max
                ),
            )
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        scaled = value * factor
        if isinstance(value, int) and math.isfinite(scaled):
            return int(max(min(scaled, 2**63 - 1), -(2**63)))
        return scaled
    return draw(VALUES[kind])


# --- the harness --------------------------------------------------------------------------

Hostile = Callable[
    [Message, RecordDict], RecordDict
]  # (message, the honest reply) -> what it sends


@dataclass
class Outcome:
    value: object  # the phase's result, as the protocol reads it
    messenger: Messenger


def _same(a, b, atol: float) -> bool:
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k], atol) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, atol) for x, y in zip(a, b))
    if isinstance(a, (np.ndarray, float, int)) and not isinstance(a, bool):
        return np.allclose(a, b, rtol=1e-9, atol=atol, equal_nan=True)
    return a == b


def _finite(value) -> bool:
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiu":
        return bool(np.all(np.isfinite(value)))
    return not isinstance(value, float) or math.isfinite(value)


def _counted(messenger: Messenger) -> int:
    """Every reply counted once; how many were refused (honest nodes never fail: a failed reply
    is one the hostile node marked as its client's error)."""
    refused = 0
    for phase, rounds in messenger.faults.items():
        for counts in rounds.values():
            parts = ("failed", "malformed", "duplicate", "timed_out", "accepted")
            assert counts["sent"] == sum(counts.get(k, 0) for k in parts), (phase, counts)
            assert counts["timed_out"] == 0, (phase, counts)
            refused += counts["failed"] + counts["malformed"] + counts.get("duplicate", 0)
    return refused


def fuzz(
    profile: str,
    drive: Callable[[Hostile], Outcome],
    needs_all: bool = False,
    bounded: Callable[[object, list[RecordDict]], bool] | None = None,
    honest_result: bool = True,
    atol: float = 1e-12,
) -> None:
    """``drive`` the phase with the hostile node sending Hypothesis' replies (``profile``); the
    checks of the module's docstring (``honest_result`` False: a refused reply may change the
    result, as a refused partition claim leaves the claimed node out too; ``atol``: how far two
    honest results may lie apart, CKKS's noise)."""
    seed_server(0)  # Flower samples nodes (and so orders replies) from its generator
    baseline = (
        None if needs_all or not honest_result else drive(lambda msg, honest: RecordDict()).value
    )

    def body(data):
        sent: list[RecordDict] = []

        def send(msg: Message, honest: RecordDict) -> RecordDict:
            sent.append(data.draw(hostile(honest), label="reply"))
            return sent[-1]

        seed_server(0)
        try:
            out = drive(send)
        except PhaseFailed:
            assert needs_all, "a phase that goes on with any reply stopped"
            return
        refused = _counted(out.messenger)
        if refused == len(sent) and baseline is not None:
            assert _same(out.value, baseline, atol), "a refused reply moved the result"
        assert _finite(out.value), out.value
        assert bounded is None or bounded(out.value, sent), out.value

    settings(settings.get_profile(profile))(given(st.data())(body))()


def _with_hostile(handlers: dict, send: Hostile, whoami: bool = False) -> dict:
    """``handlers`` with node HOSTILE sending ``send(msg, what it would have sent)`` (to WHOAMI
    too where ``whoami``: its own test fuzzes it)."""
    honest = handlers[HOSTILE]

    def handle(msg):
        told = WHOAMI in msg.content.config_records and not whoami
        return honest(msg) if told else send(msg, honest(msg))

    return {**handlers, HOSTILE: handle}


# --- the core: whoami, a SuperNode's batch ----------------------------------------------------


@pytest.mark.parametrize("profile", PROFILE)
def test_whoami(profile):
    def drive(send):
        handlers = {n: _whoami(lambda msg: RecordDict(), n - 1) for n in range(1, HOSTILE + 1)}
        messenger = Messenger(
            InProcessGrid(_with_hostile(handlers, send, whoami=True)),
            timeout=5,
            know_partitions=True,
        )
        return Outcome(messenger.node_ids(), messenger)

    def bounded(
        nodes, sent
    ):  # only the hostile node and a node whose partition it claimed can be left out
        claimed = [n for n in range(1, HOSTILE) if n not in nodes]
        return (
            set(nodes) <= set(range(1, HOSTILE + 1))
            and len(claimed) <= 1
            and list(nodes) == sorted(nodes)
        )

    fuzz(profile, drive, bounded=bounded, honest_result=False)


@pytest.mark.parametrize("profile", PROFILE)
def test_a_supernodes_batch_reply(profile):
    """The hostile SuperNode answers for its three logical clients: whatever it packs, the other
    SuperNodes' clients' replies are theirs."""

    def drive(send):
        grid = ShardedGrid(
            tampering_supernodes(3, lambda p, packed: send(None, packed) if p == 1 else packed),
            9,
            timeout=5.0,
            poll=0.0,
        )
        messenger = Messenger(grid, 5.0, poll_seconds=0.0)
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
        own = {m.metadata.src_node_id: m.content.array_records.get("w") for m in replies}
        return Outcome(
            {
                n: float(r["w"].numpy()[0])
                for n, r in own.items()
                if r is not None and (n - 1) % 3 != 1
            },
            messenger,
        )

    fuzz(profile, drive, bounded=lambda own, sent: all(v == n - 1 for n, v in own.items()))


# --- FedTP --------------------------------------------------------------------------------------

SPLITS = ["valid_freq"] * 8  # the population: 8 conversations over 4 partitions, 2 each


def _fedtp_node(partition: int):
    """A FedTP node of the 8-conversation population as the real client answers."""
    rows = hosted_rows(len(SPLITS), HOSTILE, partition)

    def handle(msg):
        if msg.metadata.message_type == MessageType.QUERY:
            return RecordDict(
                {
                    tp.INFO: ConfigRecord(
                        {
                            tp.PARTITION_ID: partition,
                            tp.INFO_SPLITS: [SPLITS[r] for r in rows],
                            tp.INFO_ROWS: rows,
                        }
                    )
                }
            )
        if msg.metadata.message_type == MessageType.TRAIN:
            return RecordDict(
                {
                    tp.ARRAYS: ArrayRecord(
                        {tp.VECTORS: Array(np.eye(DIM)[[r % DIM for r in rows]])}
                    ),
                    tp.METRICS: MetricRecord({tp.NUM_EXAMPLES: len(rows)}),
                }
            )
        config = msg.content[tp.CONFIG]
        names, turn_level = list(config[tp.VARIANT_NAMES]), bool(config[tp.TURN_LEVEL])
        sums = ("hits", "err", "support")
        metrics = {
            tp.NUM_EXAMPLES: 2,
            "valid_freq/turns": 2,
            **{
                f"valid_freq/{v}/{m}": (partition % 2 if m == "hits" else 0.5)
                for v in names
                for m in sums
            },
        }
        if turn_level:
            metrics |= {
                "turn/gold": [1, 2],
                "turn/ambiguous": [0, 1],
                "turn/row": [rows[0], rows[-1]],
                **{
                    f"turn/{m}/{v}": ([1, partition % DIM] if m == "pick" else [0.5, 0.25])
                    for v in names
                    for m in ("pick", "err", "support")
                },
            }
        return RecordDict({tp.METRICS: MetricRecord(metrics)})

    return _whoami(handle, partition)


def _fedtp_drive(run: Callable[[fedtp.Context], object]) -> Callable[[Hostile], Outcome]:
    def drive(send):
        handlers = _with_hostile({n: _fedtp_node(n - 1) for n in range(1, HOSTILE + 1)}, send)
        ctx = _fedtp_context(handlers)
        ctx.messenger = Messenger(InProcessGrid(handlers), timeout=5, know_partitions=True)
        ctx.hosted = {
            n: _fedtp_node(n - 1)(
                Message(RecordDict(), dst_node_id=n, message_type=MessageType.QUERY)
            )[tp.INFO]
            for n in handlers
        }
        return Outcome(run(ctx), ctx.messenger)

    return drive


@pytest.mark.parametrize("profile", PROFILE)
def test_fedtp_discover(profile):
    fuzz(
        profile,
        _fedtp_drive(
            lambda ctx: {n: dict(i) for n, i in fedtp.discover(ctx.messenger, {}, SPLITS).items()}
        ),
        bounded=lambda hosted, sent: all(
            i[tp.INFO_ROWS] == hosted_rows(8, HOSTILE, n - 1) for n, i in hosted.items()
        ),
    )


@pytest.mark.parametrize("profile", PROFILE)
def test_fedtp_prior(profile):
    fuzz(
        profile,
        _fedtp_drive(lambda ctx: fedtp.train_prior(ctx, DIM).vector),
        bounded=lambda prior, sent: np.all(prior >= 0) and abs(prior.sum() - 1) < 1e-9,
    )


@pytest.mark.parametrize("profile", PROFILE)
def test_fedtp_tune(profile):
    fuzz(
        profile,
        _fedtp_drive(lambda ctx: fedtp.tune_lambda(ctx, np.full(DIM, 1 / DIM))),
        bounded=lambda out, sent: all(r["ehr"] is None or 0 <= r["ehr"] <= 1 for r in out[0]),
    )


@pytest.mark.parametrize("profile", PROFILE)
def test_fedtp_test(profile):
    """The test phase, turn level: its sums, turns and the paired analyses read from them."""

    def run(ctx):
        ctx.task = {**ctx.task, "test_splits": ["valid_freq"]}
        sums, turns, _ = fedtp.evaluate_routers(ctx, np.full(DIM, 1 / DIM), 0.01)
        return {
            "sums": sums,
            "analyses": fedtp._paired_analyses(turns, "conversation", 20, 0)[0],
            "routers": {r: fedtp._scores(sums, ["valid_freq"], r) for r in fedtp.ROUTERS},
        }

    fuzz(
        profile,
        _fedtp_drive(run),
        bounded=lambda out, sent: all(
            v["ehr"] is None or 0 <= v["ehr"] <= 1 for v in out["routers"].values()
        ),
    )


# --- FedBis / FedBiscuit ------------------------------------------------------------------------


def _preference_drive(run: Callable[[fedbiscuit.Context], object], discovered: bool = True):
    def drive(send):
        handlers = _with_hostile(
            {n: _preference_client(n - 1, float(n)) for n in range(1, HOSTILE + 1)}, send
        )
        if not discovered:  # the discovery itself, as fedbiscuit.context asks it
            messenger = Messenger(InProcessGrid(handlers), timeout=5)
            holds = {pref.NUM_EXAMPLES: EXAMPLES, pref.NUM_VALID: 5, pref.POPULATION: "majority"}
            reply = pref.discover_reply(messenger.partition_of, lambda p: holds, HOSTILE)
            return Outcome(discover(messenger, {}, reply)[0], messenger)
        honest = {**handlers, HOSTILE: _preference_client(HOSTILE - 1, float(HOSTILE))}
        ctx = _preference_context(honest)  # discovery (fuzzed above) from the honest replies
        ctx.messenger = Messenger(InProcessGrid(handlers), timeout=5)
        return Outcome(run(ctx), ctx.messenger)

    return drive


def _in_hull(model, sent, low=1.0, high=float(HOSTILE)) -> bool:
    """Within the updates averaged: the honest ones (1 .. 4) and the hostile's arrays."""
    values = [
        np.asarray(a.numpy(), float)
        for r in sent
        for rec in r.array_records.values()
        for a in rec.values()
        if a.numpy().dtype.kind in "fiu" and a.numpy().size
    ]
    lo = min([low, *(v.min() for v in values if np.isfinite(v).all())])
    hi = max([high, *(v.max() for v in values if np.isfinite(v).all())])
    return bool(np.all((model >= lo - 1e-6) & (model <= hi + 1e-6)))


@pytest.mark.parametrize("profile", PROFILE)
def test_fedbiscuit_discover(profile):
    fuzz(profile, _preference_drive(None, discovered=False), needs_all=True)


@pytest.mark.parametrize("profile", PROFILE)
def test_fedbis_train(profile):
    spec = OmegaConf.create({"run": "fedsim_experiments.fedbiscuit.protocol.fedbis"})
    fuzz(
        profile,
        _preference_drive(lambda ctx: fedbiscuit.fedbis(ctx, "fedbis", spec)["selectors"][0]["w"]),
        bounded=_in_hull,
    )


@pytest.mark.parametrize("profile", PROFILE)
def test_fedbiscuit_train_and_regroup(profile):
    spec = OmegaConf.create(
        {"run": "fedsim_experiments.fedbiscuit.protocol.fedbiscuit", "num_selectors": 1}
    )
    fuzz(
        profile,
        _preference_drive(lambda ctx: fedbiscuit.fedbiscuit(ctx, "u1", spec)["selectors"][0]["w"]),
        bounded=_in_hull,
    )


# --- FedE4RAG -----------------------------------------------------------------------------------

INITIAL = {"w": np.zeros(3, np.float32)}


@cache
def _rag_cfg(tmp: str, rounds: int = 1):
    return compose(
        [
            "experiment=fede4rag_paper",
            DATA,
            f"num_rounds={rounds}",
            f"task.he.key_dir={tmp}/keys",
            "protocol.he_chunk_floats=4096",
            "protocol.eval_pages_per_message=10",
        ]
    )


def _rag_node(partition: int, cfg):
    """A FedE4RAG company as the real client answers (plaintext): discovery, initial weights,
    training to its partition's value, evaluation."""

    def handle(msg):
        config = msg.content[rag.CONFIG]
        if msg.metadata.message_type == MessageType.QUERY:
            if config.get(rag.QUERY_OP) == rag.INITIAL_WEIGHTS:
                return RecordDict({rag.ARRAYS: to_record(INITIAL)})
            return RecordDict(
                {
                    rag.INFO: ConfigRecord(
                        {
                            rag.PARTITION_ID: partition,
                            rag.DOCUMENTS: ["d"],
                            rag.COMPANIES: ["c"],
                            rag.NUM_PAIRS: EXAMPLES,
                        }
                    )
                }
            )
        if msg.metadata.message_type == MessageType.TRAIN:
            return RecordDict(
                {
                    rag.ARRAYS: to_record({"w": np.full(3, 1.0 + partition, np.float32)}),
                    rag.METRICS: MetricRecord(
                        {rag.NUM_EXAMPLES: EXAMPLES, "loss": 0.5, "steps": 1}
                    ),
                }
            )
        arrays = msg.content.array_records.get(rag.ARRAYS)
        key = weights_key(
            cfg.task.model, cfg.task.lora, None if arrays is None else from_record(arrays)
        )
        if config[rag.EVAL_OP] == rag.ENCODE:
            metrics = {rag.MISSING: [], rag.PIECES: 1, rag.CORPUS_PAGES: 7}
        else:
            metrics = {
                f"{label}/{m}": 0.25 for label in fede4rag.scored(cfg) for m in RETRIEVAL
            } | {
                f"{label}/{n}": 5
                for label in fede4rag.scored(cfg)
                for n in ("questions", "corpus-pages")
            }
        return RecordDict(
            {
                rag.METRICS: MetricRecord(metrics),
                rag.WEIGHTS_INFO: ConfigRecord({rag.WEIGHTS_KEY: key}),
            }
        )

    return handle


def _rag_drive(run, hostile_node: int = HOSTILE, discovered: bool = True):
    def drive(send):
        cfg = _rag_cfg("/tmp/fedsim-fuzz-unused")
        handlers = {n: _rag_node(n - 1, cfg) for n in range(1, HOSTILE + 1)}
        fuzzed = {**handlers, hostile_node: lambda msg: send(msg, handlers[hostile_node](msg))}
        messenger = Messenger(InProcessGrid(fuzzed), timeout=5)
        if not discovered:
            return Outcome(fede4rag._discover(messenger, {})[1], messenger)
        nodes, info = fede4rag._discover(Messenger(InProcessGrid(handlers), timeout=5), {})
        ctx = fede4rag.Context(
            messenger, cfg, {}, nodes, info, budget=4, plan=PrivacyPlan.fresh(cfg)
        )
        return Outcome(run(ctx), messenger)

    return drive


FEDAVG = OmegaConf.create(
    {"run": "fedsim_experiments.fede4rag.protocol.federated", "he": False, "kd_weight": 0.0}
)


@pytest.mark.parametrize("profile", PROFILE)
def test_fede4rag_discover(profile):
    fuzz(profile, _rag_drive(None, discovered=False), needs_all=True)


@pytest.mark.parametrize("profile", PROFILE)
def test_fede4rag_initial_weights(profile):
    fuzz(
        profile,
        _rag_drive(lambda ctx: from_record(fede4rag._initial(ctx)), hostile_node=1),
        needs_all=True,
    )


@pytest.mark.parametrize("profile", PROFILE)
def test_fede4rag_fedavg_train(profile):
    fuzz(
        profile,
        _rag_drive(lambda ctx: from_record(fede4rag.federated(ctx, "fedavg", FEDAVG).arrays)["w"]),
        bounded=_in_hull,
    )


@pytest.mark.parametrize("profile", PROFILE)
def test_fede4rag_alone_and_centralized(profile):
    def run(ctx):
        alone = fede4rag.alone(
            ctx, "alone", OmegaConf.create({"which": "smallest"})
        )  # the hostile node: partition 3
        return {
            "alone": alone.details["pairs"],
            "central": fede4rag.centralized(ctx, "central", None).details,
        }

    fuzz(profile, _rag_drive(run, hostile_node=1), needs_all=True)


@pytest.mark.parametrize("profile", PROFILE)
def test_fede4rag_evaluation(profile):
    """The evaluator (partition 0) encodes the corpus and scores the method's model."""
    trained = fede4rag.Trained(rag.FROM_ARRAYS, {}, to_record(INITIAL))
    fuzz(
        profile,
        _rag_drive(lambda ctx: fede4rag._evaluate(ctx, "m", trained), hostile_node=1),
        needs_all=True,
        bounded=lambda scores, sent: all(
            0 <= v <= 1
            for s in fede4rag.scored(_rag_cfg("/tmp/fedsim-fuzz-unused"))
            for k, v in scores[s].items()
            if k in RETRIEVAL
        ),
    )


def _he_drive(tmp_path_factory, floats: int):
    """FedE4RAG's HE method over HE clients of ``floats`` floats (one trip at most 4096, else the
    chunk phases); what the honest node of partition 0 installed."""
    tmp = tmp_path_factory.mktemp("he")
    (tmp / "keys").mkdir(mode=0o700)  # one key for every drive, made once
    cfg = _rag_cfg(str(tmp))
    vectors = [np.full(floats, 1.0 + p) for p in range(HOSTILE)]
    spec = OmegaConf.create(
        {"run": "fedsim_experiments.fede4rag.protocol.federated", "he": True, "kd_weight": 0.0}
    )

    def drive(send):
        folder = tmp_path_factory.mktemp("run")
        clients = {
            n: HEVectorClient(folder, n - 1, vectors[n - 1], EXAMPLES, key_dir=tmp / "keys")
            for n in range(1, HOSTILE + 1)
        }
        handlers = _with_hostile(clients, send)
        messenger = Messenger(InProcessGrid(handlers), timeout=5)
        ctx = fede4rag.Context(
            messenger,
            cfg,
            {},
            *fede4rag._discover(Messenger(InProcessGrid(clients), 5), {}),
            budget=1,
            plan=PrivacyPlan.fresh(cfg),
        )
        fede4rag.federated(ctx, "he", spec)
        return Outcome(clients[1].he.global_weights(1), messenger)

    return drive


@pytest.mark.parametrize("profile", PROFILE)
@pytest.mark.parametrize("floats", [100, 5000], ids=["one trip", "chunks"])
def test_fede4rag_he(profile, floats, tmp_path_factory):
    fuzz(
        profile,
        _he_drive(tmp_path_factory, floats),
        atol=1e-4,  # ciphertexts that parse are the node's own
        bounded=lambda installed, sent: np.all(
            (installed > 1 - 1e-3) & (installed < HOSTILE + 1e-3)
        ),
    )


# --- FedDTRE ------------------------------------------------------------------------------------


def _dialogue_node(partition: int):
    """A FedDTRE client as the real one answers: its examples, the evaluator's or a generator's
    training (mixing as the schedule asks), its personalized evaluation."""

    def handle(msg):
        if msg.metadata.message_type == MessageType.QUERY:
            return RecordDict(
                {
                    dtre.INFO: ConfigRecord(
                        {dtre.PARTITION_ID: partition, "examples-persona_chat": 40}
                    )
                }
            )
        config = msg.content[dtre.CONFIG]
        if msg.metadata.message_type == MessageType.EVALUATE:
            scores = {
                prefix + m: 0.5
                for prefix in (dtre.PERSONAL, dtre.GLOBAL)
                for m in feddtre_report.METRICS
            }
            return RecordDict(
                {
                    dtre.METRICS: MetricRecord(
                        {dtre.KEPT_LOCAL: 1, dtre.DISTANCE: 0.1, dtre.CONTEXTS: 2, **scores}
                    )
                }
            )
        w = from_record(msg.content[dtre.ARRAYS])
        examples = (
            30 if config.get(dtre.OBJECTIVE) == dtre.EVALUATOR else 40
        )  # 3 per trust context (10)
        metrics = {dtre.NUM_EXAMPLES: examples, "train-loss": 0.5, "train-seconds": 0.1}
        if dtre.MIXING in config:
            metrics |= {
                dtre.ALPHA: 0.5,
                dtre.S_LOCAL: 0.4,
                dtre.S_GLOBAL: 0.6,
                dtre.S_GAP_SE: 0.05,
                dtre.SCORED: 10,
                dtre.TRAIN_NLL: 2.0,
                dtre.HELDOUT_NLL: 2.5,
            }  # feddtre_paper's eval_contexts
        return RecordDict(
            {
                dtre.ARRAYS: to_record({k: np.full_like(v, 1.0 + partition) for k, v in w.items()}),
                dtre.METRICS: MetricRecord(metrics),
            }
        )

    return handle


@cache
def _dtre_cfg():
    return compose(
        [
            "experiment=feddtre_paper",
            DATA,
            "num_rounds=1",
            f"task.num_clients={HOSTILE}",
            f"protocol.clients_per_round={HOSTILE}",
            f"protocol.evaluator.clients_per_round={HOSTILE}",
            "protocol.evaluator.rounds=1",
            "task.trust.contexts_per_client=10",
        ]
    )


def _dtre_drive(run, discovered: bool = True):
    def drive(send):
        cfg = _dtre_cfg()
        handlers = _with_hostile({n: _dialogue_node(n - 1) for n in range(1, HOSTILE + 1)}, send)
        messenger = Messenger(InProcessGrid(handlers), timeout=5)
        if not discovered:
            holds = {"persona_chat": 40}
            reply = dtre.discover_reply(
                messenger.partition_of, list(holds), lambda p: holds, HOSTILE
            )
            return Outcome(discover(messenger, {}, reply)[1], messenger)
        honest = {n: _dialogue_node(n - 1) for n in range(1, HOSTILE + 1)}
        nodes, info = discover(Messenger(InProcessGrid(honest), 5), {})
        ctx = feddtre.Context(
            messenger,
            cfg,
            {},
            nodes,
            {p: dict(i) for p, i in info.items()},
            feddtre.check(cfg),
            {"persona_chat": None},
            "unused",
            INITIAL,
            plan=PrivacyPlan.fresh(cfg),
        )
        return Outcome(run(ctx), messenger)

    return drive


@pytest.mark.parametrize("profile", PROFILE)
def test_feddtre_discover(profile):
    fuzz(profile, _dtre_drive(None, discovered=False), needs_all=True)


@pytest.mark.parametrize("profile", PROFILE)
def test_feddtre_evaluator_train(profile):
    def run(ctx):
        config = {dtre.OBJECTIVE: dtre.EVALUATOR}
        e = ctx.protocol.evaluator
        reply = lambda sent: dtre.train_reply(sent, ctx.trust_examples, "train-loss")  # noqa: E731
        return from_record(
            ctx.fedavg(
                "evaluator", to_record(INITIAL), 1, config, 1.0, reply, entry=e.strategy
            ).arrays
        )

    fuzz(profile, _dtre_drive(lambda ctx: run(ctx)["w"]), bounded=_in_hull)


@pytest.mark.parametrize("profile", PROFILE)
@pytest.mark.parametrize("method", ["fedavg", "feddtre"])
def test_feddtre_generator_and_personal(profile, method):
    """A generator method's rounds (FedAvg, TrustAlpha's mixing), then every client's
    personalized evaluation; the alphas and the spreads read from them."""

    def run(ctx):
        spec = OmegaConf.create(OmegaConf.to_container(ctx.cfg.protocol.methods[method]))
        out = feddtre.federated(ctx, method, spec, "persona_chat")
        return {
            "w": out["weights"]["w"],
            "personalized": out["personalized"],
            "alphas": feddtre_report.alpha_rows(out.get("alphas", {})),
        }

    fuzz(
        profile,
        _dtre_drive(run),
        bounded=lambda out, sent: (
            _in_hull(out["w"], sent)
            and all(0 <= c[dtre.ALPHA] <= 1 for r in out["alphas"].values() for c in r["clients"])
        ),
    )


def test_the_fuzzer_reaches_the_checks():
    """Not a blind fuzzer: mutations of an honest reply keep most of it, so the declared checks
    (bounds, shapes, keys) see them, not only the record names."""
    honest = RecordDict(
        {
            "arrays": to_record({"w": np.zeros(3, np.float32)}),
            "metrics": MetricRecord({"num-examples": 5, "train-loss": 0.5}),
        }
    )
    kept = []

    @settings(settings.get_profile("replies-fast"), max_examples=50)
    @given(hostile(honest))
    def sample(reply):
        kept.append(set(reply.keys()) == {"arrays", "metrics"})

    sample()
    assert 0.3 < sum(kept) / len(kept) < 1.0
