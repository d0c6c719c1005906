"""Every strategy entry x every experiment's strategy slot x every privacy wrapper.

1. The refusals (config only): each pair is checked exactly as ``fedsim run`` checks it before
   anything starts (``fedsim.schema.check``); a refused pair names its reason, which comes from
   the entries' data (``traits``, the slot's ``refuses``), never from a name check.
2. The runs (in process, no Ray: the Ray path of each experiment is covered by its
   ``test_e2e_*``): every accepted pair builds its strategy the way the experiment does
   (``fedsim_experiments.common.build_strategy``: the slot's loss key, the privacy wrapper, its n and
   its private noise) and runs two rounds over an in-process grid of five clients, one of which
   crashes. The clients of the weight slots are stand-ins speaking the slot's reply contract
   (least squares on their own data, the slot's loss key, through the real ClientApp's
   clipping mod); FedTP's are its real clients on a slice of Topical-Chat. Each run must
   complete, change the global model and count the crash; under a DP wrapper, each round is
   one release in the run's privacy account.
"""

import gc
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from omegaconf import OmegaConf
from test_determinism import serve

from fedsim.client_app import dp_clipping_mod
from fedsim.config import CONF_DIR, choices, compose
from fedsim.inprocess_grid import InProcessGrid
from fedsim.messaging import ANY, Messenger, Policy, client_config
from fedsim.records import from_record, to_record
from fedsim.schema import check
from fedsim.validators import model_reply
from fedsim_clients import fedtp_messages as keys
from fedsim_experiments import fedtp
from fedsim_experiments.common import build_strategy
from fedsim_tasks.topical_chat.dataset import load_topics

SLOTS = ["fedtp", "fede4rag_paper", "feddtre_paper", "fedbiscuit_paper"]  # one per method's task
STRATEGIES, PRIVACY = choices("strategy"), choices("privacy")
CLIENTS, CRASH, ROUNDS, DIM = 5, 4, 2, 6


def _load(group: str, name: str):
    return OmegaConf.load(CONF_DIR / group / f"{name}.yaml")


@pytest.fixture(scope="module", autouse=True)
def _cheap_collections():
    """Flower's robust strategies read replies with ``to_numpy_ndarrays(keep_input=False)``, which
    runs ``gc.collect()`` per reply; with torch and transformers imported each takes ~0.3 s here.
    Freezing what is alive at the start keeps those collections to the objects a pair makes."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="module")
def base():
    """Each experiment composed once; the pairs swap its strategy and privacy nodes."""
    return {exp: compose([f"experiment={exp}", "data_root=../shared/data"]) for exp in SLOTS}


def with_pair(cfg, strategy: str, privacy: str):
    cfg = cfg.copy()
    OmegaConf.set_struct(cfg, False)
    cfg.strategy = _load("strategy", strategy)
    cfg.privacy.he = cfg.privacy.wrapper = None  # what none.yaml leaves out
    for key, value in _load("privacy", privacy).items():
        cfg.privacy[key] = value
    return cfg


def verdict(cfg) -> str | None:
    """None if the pair runs, else the reason it is refused."""
    try:
        check(cfg)
    except ValueError as exc:
        return str(exc)
    return None


def test_every_pair_is_accepted_or_refused_with_a_reason_from_the_data(base):
    matrix = {(e, s, p): verdict(with_pair(base[e], s, p)) for e in SLOTS for s in STRATEGIES for p in PRIVACY}
    for (exp, strategy, privacy), why in matrix.items():
        traits = _load("strategy", strategy).traits
        kind = _load("privacy", privacy).kind
        reasons = [r for r in (traits.he, traits.dp, _load("privacy", privacy).get("he")) if r]
        reasons += list(OmegaConf.to_container(base[exp].protocol.strategy_slot.refuses).values())
        if why is not None:  # a refusal says which experiment or wrapper, and why, in the data's words
            assert any(r in why for r in reasons) or "cannot run strategy" in why, (exp, strategy, privacy, why)
        if traits.aggregation == "robust" and kind != "none":
            assert why is not None, (exp, strategy, privacy)  # no robust aggregator under HE or DP
    ok = lambda e, s, p: matrix[(e, s, p)] is None  # noqa: E731
    assert ok("feddtre_paper", "fedadam", "none") and ok("feddtre_paper", "trust_alpha", "dp_server_fixed")
    assert ok("fede4rag_paper", "fedprox", "he_fedavg") and not ok("fede4rag_paper", "fedadam", "none")
    assert "run under HE" in matrix[("fede4rag_paper", "fedadam", "none")]  # its method fede4rag is he: true
    assert "server optimizer step" in matrix[("fede4rag_paper", "fedadam", "none")]
    assert "Krum compares" not in matrix[("fede4rag_paper", "krum", "he_fedavg")]  # the entry's own words
    assert not ok("fedtp", "fedadam", "none") and ok("fedtp", "fedavg", "none") and ok("fedtp", "dp_mean", "none")
    assert all(not ok(e, "selector_groups", p) for e in SLOTS for p in PRIVACY)
    assert all(not ok(e, s, "he_fedavg") for e in ("fedtp", "feddtre_paper", "fedbiscuit_paper") for s in STRATEGIES)


def test_dp_around_fede4rag_needs_its_he_method_left_out(base):
    cfg = with_pair(base["fede4rag_paper"], "fedprox", "dp_server_fixed")
    assert "run under HE" in verdict(cfg)
    cfg.protocol.methods.fede4rag = None
    assert verdict(cfg) is None


def _stand_in(partition: int, loss_key: str):
    """A weights client: a few gradient steps of least squares on its own data from the model
    it received; replies the slot's contract (arrays, num-examples, the loss under ``loss_key``)."""
    rng = np.random.default_rng(partition)
    x = rng.normal(size=(20 + 5 * partition, DIM))
    y = x @ np.linspace(-1, 1, DIM) + 0.1 * rng.normal(size=len(x))

    def train(msg: Message, context) -> Message:
        if partition == CRASH:
            raise RuntimeError("injected crash")
        w = from_record(msg.content["arrays"])["w"].astype(np.float64)
        for _ in range(3):
            w = w - 0.1 * x.T @ (x @ w - y) / len(x)
        loss = float(np.mean((x @ w - y) ** 2))
        return Message(RecordDict({"arrays": to_record({"w": w.astype(np.float32)}),
                                   "metrics": MetricRecord({"num-examples": len(x), loss_key: loss})}), reply_to=msg)

    context = Context(run_id=1, node_id=partition, state=RecordDict(), run_config={}, node_config={})
    return lambda msg: dp_clipping_mod(msg, context, train).content


WEIGHT_PAIRS = [(e, s, p) for e in ("fede4rag_paper", "feddtre_paper", "fedbiscuit_paper") for s in STRATEGIES
                for p in PRIVACY if _load("privacy", p).kind != "he" and _load("strategy", s).traits.takes == "weights"]


@pytest.mark.parametrize("exp,strategy,privacy", WEIGHT_PAIRS)
def test_weight_slots_run_every_accepted_pair(base, exp, strategy, privacy):
    cfg = with_pair(base[exp], strategy, privacy)
    cfg.protocol.methods.fede4rag = None  # FedE4RAG's HE method is the HE wrapper's (test_he_fedavg.py)
    if verdict(cfg) is not None:
        pytest.skip("refused: the first test checks why")
    loss_key = cfg.protocol.strategy_slot.loss_key
    messenger = Messenger(InProcessGrid({p + 1: _stand_in(p, loss_key) for p in range(CLIENTS)}), timeout=5)
    initial = to_record({"w": np.zeros(DIM, np.float32)})
    strategy_ = build_strategy(cfg, messenger, CLIENTS, fraction_evaluate=0.0)
    result = strategy_.start(messenger.grid("slot", Policy(ANY, model_reply(initial))), initial, ROUNDS, 5,
                             ConfigRecord({}))
    w = from_record(result.arrays)["w"]
    assert np.all(np.isfinite(w)) and np.abs(w).max() > 1e-3  # the global model moved off zero
    for rnd in range(1, ROUNDS + 1):
        assert messenger.faults["slot/train"][rnd]["failed"] == 1, messenger.faults
        assert messenger.faults["slot/train"][rnd]["accepted"] == CLIENTS - 1
    if cfg.privacy.kind == "dp":  # every round one release, in the account results.json reports
        assert messenger.central_dp.releases == {"slot": ROUNDS}


FEDTP_SLICE = ["task.max_per_split=5", "data_root=../shared/data"]
FEDTP_TAKES = ("rows", "weights")


@pytest.fixture(scope="module")
def fedtp_cfg():
    return compose(["experiment=fedtp", *FEDTP_SLICE])


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if _load("strategy", s).traits.takes in FEDTP_TAKES])
def test_fedtp_prior_with_every_accepted_strategy(fedtp_cfg, strategy):
    """FedTP's prior phase with its real clients (20 conversations, one per client; the first
    prior client crashes)."""
    cfg = with_pair(fedtp_cfg, strategy, "none")
    if verdict(cfg) is not None:
        pytest.skip("refused: the first test checks why")
    base_config, task = client_config(cfg), OmegaConf.to_container(cfg.task, resolve=True)
    probe = Messenger(InProcessGrid({p + 1: (lambda msg, p=p: serve(msg, p, 20)) for p in range(20)}), timeout=30)
    prior_nodes = [n for n, info in fedtp.discover(probe, base_config).items()
                   if set(info[keys.INFO_SPLITS]) & set(task["prior_splits"])]
    crash = prior_nodes[0]
    messenger = Messenger(InProcessGrid({n: (lambda msg, n=n: _crash() if n == crash else serve(msg, n - 1, 20))
                                         for n in prior_nodes}), timeout=30)
    dim = len(load_topics(cfg.data_root))
    uniform = np.full(dim, 1.0 / dim)
    result = fedtp.dp_strategy(cfg, messenger).start(
        messenger.grid("prior", fedtp.prior_policy(dim)), ArrayRecord({keys.VECTORS: Array(uniform)}), 1, 30,
        ConfigRecord({**base_config, keys.SPLITS: task["prior_splits"]}))
    prior = result.arrays[keys.VECTORS].numpy().reshape(-1)
    assert prior.shape == (dim,) and np.all(np.isfinite(prior)) and not np.allclose(prior, uniform)
    assert messenger.faults["prior/train"][1]["failed"] == 1
    assert messenger.faults["prior/train"][1]["accepted"] == len(prior_nodes) - 1


def _crash():
    raise RuntimeError("injected crash")


def test_matrix_doc_names_every_entry():
    doc = (Path(__file__).parents[1] / "docs" / "strategies.md").read_text()
    assert all(f"`{s}`" in doc for s in STRATEGIES) and all(f"`{p}`" in doc for p in PRIVACY)
