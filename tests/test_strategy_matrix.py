"""Every strategy entry x every experiment's strategy slot x every privacy wrapper.

1. The refusals (config only): each pair is checked exactly as ``fedsim run`` checks it before
   anything starts (``fedsim.config.schema.check``); a refused pair names its reason, which comes from
   the entries' data (``traits``, the slot's ``honours`` and ``refuses``), never from a name check.
2. The runs (in process, no Ray: the Ray path of each experiment is covered by its
   ``test_e2e_*``), five clients of which one crashes (``faults.crash``, the real ClientApp's
   fault injection), two rounds. The weight slots run every accepted pair with their real
   clients (``RetrieverClient``, ``DialogueClient``, ``PreferenceClient``) through the real
   ClientApp (its mods: fault injection, client-side clipping) on a small slice of their data,
   every model the tiny BERT of ``fedsim_tasks/test_causal_lm.py``; the server side is the
   experiment's own code: its ``context`` (discovery, initial weights) and the slot's method
   (``fede4rag.federated`` with method ``fedavg``, ``feddtre.federated`` with the federated
   baseline on Synthetic-Persona-Chat, its personalized evaluation included,
   ``fedbiscuit.fedbis``), which build the strategy (``build_strategy``), the train config and
   the reply check. FedTP runs its prior phase with its real clients on a slice of
   Topical-Chat. Each run must complete, move the global model (the real model's arrays) to
   finite values and count the crash as failed, the other replies as accepted; under a DP
   wrapper, each round is one release in the run's privacy account.
3. The client keys (config only, then runs): a strategy's ``traits.client_keys`` (FedProx's
   ``proximal-mu``) must act wherever the pair is accepted: in each weight slot, FedProx at mu 0
   gives FedAvg's global model to the bit and at mu 10 another one (two local steps: at the first
   the term's gradient is zero); a slot whose clients train nothing (FedTP) refuses it.

Cost: the default suite runs each weight slot's every strategy without privacy and FedAvg in every
privacy wrapper; the rest of the cross product is marked ``exhaustive`` (``pytest -m exhaustive``).
"""

import gc
from dataclasses import replace
from functools import cache, partial
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from hydra.utils import instantiate
from omegaconf import OmegaConf
from test_determinism import serve

from conftest import data_root_override
from fedsim.config.compose import CONF_DIR, choices, compose
from fedsim.config.node_local import from_run
from fedsim.config.schema import check
from fedsim.flower.strategies import strategy_utils
from fedsim.privacy.plan import PrivacyPlan
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger, client_config
from fedsim.runtime.records import from_record, to_bytes
from fedsim.runtime.server_app import seed_server
from fedsim_clients import fedtp_messages as keys
from fedsim_experiments.common import build_strategy
from fedsim_experiments.fedbiscuit import protocol as fedbiscuit
from fedsim_experiments.feddtre import protocol as feddtre
from fedsim_experiments.fede4rag import protocol as fede4rag
from fedsim_experiments.fedtp import protocol as fedtp
from fedsim_tasks.causal_lm import load_policy
from fedsim_tasks.test_causal_lm import encoder_dir  # noqa: F401 (fixture: the tiny BERT of every model here)
from fedsim_tasks.topical_chat.dataset import load_topics

DATA = data_root_override()

SLOTS = ["fedtp", "fede4rag_paper", "feddtre_paper", "fedbiscuit_paper"]  # one per method's task
STRATEGIES, PRIVACY = choices("strategy"), choices("privacy")
CLIENTS, CRASH, ROUNDS = 5, 4, 2
SUM_ONLY = ("fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad")  # SecAgg+ sums them


@cache  # collection reads them for every pair; a config takes a copy of what it is given
def _load(group: str, name: str):
    return OmegaConf.load(CONF_DIR / group / f"{name}.yaml")


@pytest.fixture(scope="module", autouse=True)
def _cheap_collections():
    """Flower's Bulyan and QFedAvg read replies with ``to_numpy_ndarrays(keep_input=False)``, which
    runs ``gc.collect()`` per reply; with torch and transformers imported each takes ~0.3 s here.
    Freezing what is alive at the start keeps those collections to the objects a pair makes
    (the weight slots' clients freeze again after each reply: ``_serve_frozen``)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="module")
def base():
    """Each experiment composed once; the pairs swap its strategy and privacy nodes."""
    return {exp: compose([f"experiment={exp}", DATA]) for exp in SLOTS}


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
    matrix = {
        (e, s, p): verdict(with_pair(base[e], s, p))
        for e in SLOTS
        for s in STRATEGIES
        for p in PRIVACY
    }
    for (exp, strategy, privacy), why in matrix.items():
        traits = _load("strategy", strategy).traits
        kind = _load("privacy", privacy).kind
        reasons = [
            r
            for r in (
                traits.he,
                traits.dp,
                traits.secagg,
                traits.secagg_ddp,
                _load("privacy", privacy).get("he"),
            )
            if r
        ]
        reasons += list(OmegaConf.to_container(base[exp].protocol.strategy_slot.refuses).values())
        if (
            why is not None
        ):  # a refusal says which experiment or wrapper, and why, in the data's words
            assert any(r in why for r in reasons) or "cannot run strategy" in why, (
                exp,
                strategy,
                privacy,
                why,
            )
        if traits.aggregation == "robust" and kind != "none":
            assert why is not None, (
                exp,
                strategy,
                privacy,
            )  # no robust aggregator under HE, DP, SecAgg
    ok = lambda e, s, p: matrix[(e, s, p)] is None  # noqa: E731
    assert ok("feddtre_paper", "fedadam", "none") and ok(
        "feddtre_paper", "trust_alpha", "dp_server_fixed"
    )
    assert ok("fede4rag_paper", "fedprox", "he_fedavg") and not ok(
        "fede4rag_paper", "fedadam", "none"
    )
    assert (
        "run under HE" in matrix[("fede4rag_paper", "fedadam", "none")]
    )  # its method fede4rag is he: true
    assert "server optimizer step" in matrix[("fede4rag_paper", "fedadam", "none")]
    assert (
        "Krum compares" not in matrix[("fede4rag_paper", "krum", "he_fedavg")]
    )  # the entry's own words
    assert (
        not ok("fedtp", "fedadam", "none")
        and ok("fedtp", "fedavg", "none")
        and ok("fedtp", "dp_mean", "none")
    )
    assert (
        "train no model" in matrix[("fedtp", "fedprox", "none")]
    )  # its clients would ignore proximal-mu
    assert all(not ok(e, "selector_groups", p) for e in SLOTS for p in PRIVACY)
    assert all(ok(e, s, "secagg") for e in ("feddtre_paper", "fedbiscuit_paper") for s in SUM_ONLY)
    assert "SecAgg+ gives the server their sum only" in matrix[("feddtre_paper", "krum", "secagg")]
    assert "FedDTRE's trust" in matrix[("feddtre_paper", "trust_alpha", "secagg")]
    assert ok("fedtp", "dp_mean", "secagg_ddp") and not ok("fedtp", "dp_mean", "secagg")
    assert all(
        not ok(e, s, "secagg_ddp") for e in SLOTS for s in STRATEGIES if s != "dp_mean"
    )  # distributed DP releases DPMean's mean only
    assert all(
        not ok(e, s, "he_fedavg")
        for e in ("fedtp", "feddtre_paper", "fedbiscuit_paper")
        for s in STRATEGIES
    )


def test_a_slot_refuses_by_default_what_its_clients_would_not_act_on(base):
    """A method honours nothing it does not declare: FedProx's key where the slot lists none, a
    loss-weighted aggregation without a loss key, HE without the task's CKKS parameters."""
    cfg = with_pair(base["fede4rag_paper"], "fedprox", "none")
    assert verdict(cfg) is None
    cfg.protocol.strategy_slot.honours = []
    assert "strategy.proximal_mu:" in verdict(cfg) and "honours: none" in verdict(cfg)
    cfg = with_pair(base["fedbiscuit_paper"], "qfedavg", "none")
    assert verdict(cfg) is None
    cfg.protocol.strategy_slot.loss_key = None
    assert "strategy.train_loss_key:" in verdict(cfg)
    cfg.strategy.train_loss_key = "train-loss"  # named on the strategy itself: it acts
    assert verdict(cfg) is None
    cfg = with_pair(base["feddtre_paper"], "fedavg", "none")
    cfg.strategy.fraction_train = 0.3  # the protocol samples protocol.clients_per_round itself
    assert "strategy.fraction_train=0.3:" in verdict(cfg) and "act on nothing" in verdict(cfg)
    cfg = with_pair(base["fede4rag_paper"], "fedavg", "none")
    cfg.strategy.fraction_train = 0.5  # FedE4RAG's methods sample as the strategy says
    assert verdict(cfg) is None
    cfg = with_pair(base["fedbiscuit_paper"], "fedavg", "he_fedavg")
    del cfg.protocol.strategy_slot.refuses["he"]  # no stated reason: refused all the same
    assert "carries no CKKS parameters (task.he)" in verdict(cfg)


def test_dp_around_fede4rag_needs_its_he_method_left_out(base):
    cfg = with_pair(base["fede4rag_paper"], "fedprox", "dp_server_fixed")
    assert "run under HE" in verdict(cfg)
    cfg.protocol.methods.fede4rag = None
    assert verdict(cfg) is None


IID = f"{{_target_: flwr_datasets.partitioner.IidPartitioner, num_partitions: {CLIENTS}}}"
WEIGHT_SLICES = {  # each weight slot's slice: five clients, two local steps, the tiny BERT in every model's place
    "fede4rag_paper": lambda tiny, tmp: [
        "task.companies=[Boeing,PepsiCo,Costco,Nike,Apple]",
        "task.pages_per_client=4",
        f"task.model={tiny}",
        "task.max_seq_length=32",
        f"task.he.key_dir={tmp / 'keys'}",
        "protocol.local_steps=2",
        "protocol.batch_size=2",
        "protocol.methods.fede4rag=null",
    ],  # its HE method: test_he_fedavg.py
    "feddtre_paper": lambda tiny, tmp: [
        f"task.num_clients={CLIENTS}",
        "task.max_conversations=50",
        "~task.datasets.cmu_dog",
        "~task.datasets.persona_chat.partitioner",
        f"+task.datasets.persona_chat.partitioner={IID}",
        "task.trust.contexts_per_client=2",
        f"task.evaluator.model={tiny}",
        "task.evaluator.max_length=32",
        "task.evaluator.response_length=16",
        f"protocol.generator.model={tiny}",
        "protocol.generator.base_sft_steps=0",
        f"protocol.generator.base_dir={tmp / 'generator'}",
        "protocol.generator.max_length=48",
        "protocol.generator.local_steps=2",
        "protocol.generator.batch_size=2",
        "protocol.generator.eval_contexts=2",
        "protocol.generator.max_new_tokens=4",
        "protocol.personal_contexts=1",
        f"protocol.clients_per_round={CLIENTS}",
    ],
    "fedbiscuit_paper": lambda tiny, tmp: [
        "task.max_pairs=300",
        "task.splits={test: 10, judge: 10, server: 10}",
        "task.n_topics=4",
        f"task.topic_model={tiny}",
        f"task.partitioner.num_partitions={CLIENTS}",
        "task.partitioner.min_partition_size=10",
        f"task.selector.model={tiny}",
        "task.selector.max_length=32",
        "protocol.local_steps=2",
        "protocol.batch_size=4",
        "protocol.fraction_train=1.0",
    ],
}


def _feddtre_context(messenger: Messenger, cfg, plan: PrivacyPlan):
    """As ``feddtre.run`` builds it, the base generator as published (no SFT); the trust
    evaluator untrained (its weights travel to the clients that score trust)."""
    protocol = check(cfg)
    g = protocol.generator
    base, _ = feddtre.base_generator(g, cfg.data_root, int(cfg.seed))
    ctx = feddtre.context(
        messenger,
        cfg,
        protocol,
        str(base),
        load_policy(base, dict(g.lora), int(cfg.task.seed)),
        plan,
    )
    ctx.evaluator_blob = to_bytes(
        instantiate(cfg.task.evaluator, seed=int(cfg.task.seed)).weights()
    )
    return ctx


CONTEXTS = {
    "fede4rag_paper": fede4rag.context,
    "feddtre_paper": _feddtre_context,
    "fedbiscuit_paper": lambda messenger, cfg, plan: fedbiscuit.context(
        messenger, cfg, instantiate(cfg.task.selector, seed=cfg.task.seed), plan
    ),
}


def _fede4rag(ctx, name: str) -> tuple[dict, dict, str]:
    """FedE4RAG's plain FedAvg method (the slot) over every company."""
    trained = fede4rag.federated(ctx, name, ctx.cfg.protocol.methods.fedavg)
    return from_record(ctx.initial), from_record(trained.arrays), f"{name}/train"


def _feddtre(ctx, name: str) -> tuple[dict, dict, str]:
    """FedDTRE's federated baseline (the slot) on Synthetic-Persona-Chat, then every client's
    personalized evaluation."""
    out = feddtre.federated(ctx, name, ctx.cfg.protocol.methods.fedavg, "persona_chat")
    assert len(out["personalized"]["clients"]) == CLIENTS
    return ctx.initial, out["weights"], f"persona_chat/{name}/train"


def _fedbis(ctx, name: str) -> tuple[dict, dict, str]:
    """FedBis (the slot): one selector over every client."""
    out = fedbiscuit.fedbis(ctx, name, ctx.cfg.protocol.methods.fedbis)
    return ctx.initial, out["selectors"][0], f"{name}/train"


# cheapest first (seconds per pair here: ~0.2, 1.4, 2.4): a strategy's one fast case takes the first that fits
METHODS = {"fedbiscuit_paper": _fedbis, "feddtre_paper": _feddtre, "fede4rag_paper": _fede4rag}


def _serve_frozen(msg, partition: int, node: dict):
    """A client's reply, then what is alive frozen again: FedE4RAG's trainer unfreezes everything
    as it returns (``collect_only_new_objects``), after which each ``gc.collect()`` Flower's Bulyan
    and QFedAvg run per reply they read rescans the whole process (~0.5 s each here)."""
    try:
        return serve(msg, partition, CLIENTS, node)
    finally:
        gc.freeze()


@pytest.fixture(scope="module")
def slot_context(encoder_dir, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """A weight slot's runner context, built once per slot as its run builds it (discovery
    through the real clients); the ClientApp keeps each client (model, data) across the pairs."""

    @cache
    def build(exp: str):
        tmp = tmp_path_factory.mktemp(exp)
        cfg = compose(
            [
                f"experiment={exp}",
                DATA,
                f"num_rounds={ROUNDS}",
                f"faults.crash=[{CRASH}]",
                f"client_state.dir={tmp / 'state'}",
                *WEIGHT_SLICES[exp](encoder_dir, tmp),
            ]
        )
        grid = InProcessGrid(
            {
                100 + p: partial(_serve_frozen, partition=p, node=from_run(cfg))
                for p in range(CLIENTS)
            },
            keep_replies=False,
        )
        return CONTEXTS[exp](Messenger(grid, timeout=60), cfg, PrivacyPlan.fresh(cfg))

    return build


def _weight_pairs():
    """Every (weight slot, strategy its clients' replies fit, privacy wrapper but HE: FedE4RAG's
    HE path is test_he_fedavg.py's); the fast loop takes FedAvg in every wrapper on every slot and
    every other strategy once, without privacy, on the first slot of METHODS that takes it."""

    def fits(exp, s):
        accepts = _load("experiment", exp).protocol.strategy_slot.accepts
        return _load("strategy", s).traits.takes in accepts

    for exp in METHODS:
        for s in STRATEGIES:
            for p in PRIVACY:
                if fits(exp, s) and _load("privacy", p).kind != "he":
                    once = p == "none" and exp == next(e for e in METHODS if fits(e, s))
                    fast = once or s == "fedavg"
                    yield pytest.param(
                        exp, s, p, marks=() if fast else [pytest.mark.slow, pytest.mark.exhaustive]
                    )


@pytest.mark.parametrize("exp,strategy,privacy", list(_weight_pairs()))
def test_weight_slots_run_every_accepted_pair(slot_context, exp, strategy, privacy):
    ctx = slot_context(exp)
    cfg = with_pair(ctx.cfg, strategy, privacy)
    if verdict(cfg) is not None:
        pytest.skip("refused: the first test checks why")
    messenger, plan = Messenger(ctx.messenger.raw, timeout=60), PrivacyPlan.fresh(cfg)
    initial, final, phase = METHODS[exp](
        replace(ctx, cfg=cfg, messenger=messenger, plan=plan), f"{strategy}-{privacy}"
    )
    assert list(final) == list(initial)
    assert all(np.all(np.isfinite(final[k])) for k in final)
    assert any(not np.allclose(final[k], initial[k]) for k in final)  # the global model moved
    for rnd in range(1, ROUNDS + 1):
        assert messenger.faults[phase][rnd]["failed"] == 1, messenger.faults
        assert messenger.faults[phase][rnd]["accepted"] == CLIENTS - 1
    if cfg.privacy.kind == "dp":  # every round one release, in the account results.json reports
        assert plan.central.account.releases == {phase.removesuffix("/train"): ROUNDS}


KNOBS = {
    "proximal-mu": ("proximal_mu", 0.0, 10.0)
}  # client key -> the entry's argument, a value off, one on


def _knob_pairs():
    """Every (weight slot, strategy, client key it sends)."""
    for exp in METHODS:
        for s in STRATEGIES:
            for key in _load("strategy", s).traits.client_keys:
                yield exp, s, key


@pytest.mark.parametrize("exp,strategy,key", list(_knob_pairs()))
def test_client_keys_act_wherever_the_pair_is_accepted(
    slot_context, monkeypatch, exp, strategy, key
):
    ctx = slot_context(exp)
    paired = with_pair(ctx.cfg, strategy, "none")
    assert verdict(paired) is None  # every weight slot's clients train a torch model
    monkeypatch.setattr(
        strategy_utils, "random", strategy_utils.random
    )  # seed_server replaces it: given back

    def final(cfg, name: str) -> dict:
        """The slot's global model, Flower's sampling seeded as the ServerApp seeds it (its
        order is the order the aggregate sums in)."""
        seed_server(int(cfg.seed))
        return METHODS[exp](
            replace(
                ctx,
                cfg=cfg,
                messenger=Messenger(ctx.messenger.raw, timeout=60),
                plan=PrivacyPlan.fresh(cfg),
            ),
            name,
        )[1]

    argument, off, on = KNOBS[key]
    weights = {}
    for label, value in (("off", off), ("on", on)):
        cfg = paired.copy()
        cfg.strategy[argument] = value
        weights[value] = final(cfg, f"{strategy}-{label}")
    fedavg = final(with_pair(ctx.cfg, "fedavg", "none"), "fedavg-reference")
    assert all(np.array_equal(weights[off][k], fedavg[k]) for k in fedavg), (
        f"{key}={off} is not FedAvg"
    )
    assert any(not np.array_equal(weights[on][k], weights[off][k]) for k in fedavg), (
        f"{key}={on} changed nothing"
    )


FEDTP_SLICE = ["task.max_per_split=5", DATA]
FEDTP_TAKES = ("rows", "weights")


@pytest.fixture(scope="module")
def fedtp_cfg():
    return compose(["experiment=fedtp", *FEDTP_SLICE])


@pytest.mark.parametrize(
    "strategy", [s for s in STRATEGIES if _load("strategy", s).traits.takes in FEDTP_TAKES]
)
def test_fedtp_prior_with_every_accepted_strategy(fedtp_cfg, strategy):
    """FedTP's prior phase with its real clients (20 conversations, one per client; the first
    prior client crashes)."""
    cfg = with_pair(fedtp_cfg, strategy, "none")
    if verdict(cfg) is not None:
        pytest.skip("refused: the first test checks why")
    base_config, task = client_config(cfg), OmegaConf.to_container(cfg.task, resolve=True)
    probe = Messenger(
        InProcessGrid({p + 1: (lambda msg, p=p: serve(msg, p, 20)) for p in range(20)}), timeout=30
    )
    prior_nodes = [
        n
        for n, info in fedtp.discover(probe, base_config).items()
        if set(info[keys.INFO_SPLITS]) & set(task["prior_splits"])
    ]
    crash = prior_nodes[0]
    messenger = Messenger(
        InProcessGrid(
            {
                n: (lambda msg, n=n: _crash() if n == crash else serve(msg, n - 1, 20))
                for n in prior_nodes
            }
        ),
        timeout=30,
    )
    dim = len(load_topics(cfg.data_root))
    uniform = np.full(dim, 1.0 / dim)
    result = build_strategy(cfg, PrivacyPlan.fresh(cfg), len(prior_nodes)).start(
        messenger.grid("prior", fedtp.prior_policy(dim)),
        ArrayRecord({keys.VECTORS: Array(uniform)}),
        1,
        30,
        ConfigRecord({**base_config, keys.SPLITS: task["prior_splits"]}),
    )
    prior = result.arrays[keys.VECTORS].numpy().reshape(-1)
    assert prior.shape == (dim,) and np.all(np.isfinite(prior)) and not np.allclose(prior, uniform)
    assert messenger.faults["prior/train"][1]["failed"] == 1
    assert messenger.faults["prior/train"][1]["accepted"] == len(prior_nodes) - 1


def _crash():
    raise RuntimeError("injected crash")


def test_matrix_doc_names_every_entry():
    doc = (Path(__file__).parents[1] / "docs" / "strategies.md").read_text()
    assert all(f"`{s}`" in doc for s in STRATEGIES) and all(f"`{p}`" in doc for p in PRIVACY)
