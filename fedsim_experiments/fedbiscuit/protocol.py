"""FedBis / FedBiscuit's experiment protocol (METHODS.md section 4), run inside the ServerApp.

Selectors: FedBis (Flower FedAvg of one selector over sampled clients) and FedBiscuit
(``fedsim_strategies.selector_groups.SelectorGroups``, U selectors over balanced client groups), beside
two centrally trained references that see clients' pairs (non-private): ``central_majority``
(the majority population's pairs: the check that the selector can learn at all) and
``central`` (every client's pairs). Every selector is scored on the held-out test pairs for the
majority and the minority preference.

Then the RLHF phase (``fedsim_experiments/fedbiscuit/rlhf.py``): the selectors label completions of a base
policy, DPO aligns it, and a judge trained on held-out pairs only scores it against the base.

Each method is a function named by ``run`` in ``protocol.methods`` (no dispatcher here).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf

from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import RunOutput
from fedsim.runtime.messaging import ANY, Messenger, Policy, client_config
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.validators import Validator
from fedsim.seeding import stream
from fedsim_clients import preference_messages as keys
from fedsim_experiments.common import RunContext, discover
from fedsim_experiments.fedbiscuit import report
from fedsim_experiments.fedbiscuit.rlhf import run_rlhf
from fedsim_experiments.fedbiscuit.settings import WEIGHT_KEYS
from fedsim_strategies.selector_groups import SelectorGroups, majority_vote
from fedsim_tasks.hh_preference.dataset import Federation
from fedsim_tasks.hh_preference.selector import choices

log = logging.getLogger("fedsim")
CENTRAL_TRAINING = stream("central-selector-training")  # of the run's seed


@dataclass
class Context(RunContext):
    """A FedBis / FedBiscuit runner's context: the shared one, the server's view of the data and
    the selector's initial weights."""

    federation: Federation  # held-out pairs, and (for the central references only) clients' pairs
    initial: dict  # the selector's initial weights

    @property
    def weight_key(self) -> str:
        return WEIGHT_KEYS[self.cfg.protocol.client_weights]

    def train_reply(self, sent: ArrayRecord) -> Validator:
        """A client's trained model: shaped as ``sent``, weighing at most the examples it declared."""
        return keys.train_reply(
            sent, self.declared(keys.NUM_EXAMPLES), self.cfg.protocol.strategy_slot.loss_key
        )

    def train_config(self) -> dict:
        p = self.cfg.protocol
        return {
            **self.base,
            keys.OBJECTIVE: keys.SELECTOR,
            keys.LOCAL_STEPS: p.local_steps,
            keys.BATCH_SIZE: p.batch_size,
            keys.LR: p.lr,
            keys.WEIGHT_DECAY: p.weight_decay,
            keys.SEED: self.cfg.seed,
            keys.TORCH_THREADS: 1,
        }


def central(ctx: Context, name: str, spec: DictConfig) -> dict:
    """One selector trained on the pooled training pairs of the clients of ``spec.population``
    (majority | minority | all): a non-private reference trained in the server process (a
    population's own is its ceiling)."""
    clients = [ctx.federation.client(partition_id) for partition_id in sorted(ctx.nodes)]
    examples = [
        e
        for c in clients
        if spec.population == "all" or c.population == spec.population
        for e in c.train
    ]
    selector = instantiate(ctx.cfg.task.selector, seed=ctx.cfg.task.seed)
    stats = train_central(selector, examples, ctx.cfg)
    return {"selectors": [selector.weights()], "details": {"examples": len(examples), **stats}}


def train_central(selector, examples: list, cfg: DictConfig) -> dict:
    """The central references' training: ``protocol.central_steps`` steps of the clients' optimizer."""
    p = cfg.protocol
    return selector.train(
        examples,
        p.central_steps,
        p.batch_size,
        p.lr,
        CENTRAL_TRAINING.seed(cfg.seed),
        p.weight_decay,
    )


def fedbis(ctx: Context, name: str, spec: DictConfig) -> dict:
    """Flower FedAvg of one selector over sampled clients (``fraction_train`` per round)."""
    result = ctx.fedavg(
        name,
        to_record(ctx.initial),
        int(ctx.cfg.num_rounds),
        ctx.train_config(),
        ctx.cfg.protocol.fraction_train,
        ctx.train_reply,
        weighted_by_key=ctx.weight_key,
    )
    return {
        "selectors": [from_record(result.arrays)],
        "details": {"rounds": {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}},
    }


def fedbiscuit(ctx: Context, name: str, spec: DictConfig) -> dict:
    """SelectorGroups with ``spec.num_selectors`` selectors."""
    p = ctx.cfg.protocol
    return _selector_groups(
        ctx,
        name,
        int(spec.num_selectors),
        SelectorGroups(
            int(spec.num_selectors),
            p.warmup_rounds,
            p.regroup_every,
            p.regroup_quorum,
            **_group_args(ctx),
        ),
    )


def oracle_groups(ctx: Context, name: str, spec: DictConfig) -> dict:
    """SelectorGroups over the true populations, fixed for the whole run (non-private: the server
    is told who is in the minority): the minority clients train selector 0, the majority clients
    are dealt in partition order over the other ``spec.num_selectors - 1``. It separates "the
    grouping failed" from "grouped selectors cannot win here"."""
    u = int(spec.num_selectors)
    majority = sorted(
        partition_id for partition_id, i in ctx.info.items() if i[keys.POPULATION] != "minority"
    )
    groups = {
        ctx.nodes[partition_id]: 0
        for partition_id, i in ctx.info.items()
        if i[keys.POPULATION] == "minority"
    }
    groups |= {ctx.nodes[partition_id]: 1 + k % (u - 1) for k, partition_id in enumerate(majority)}
    weights = {
        ctx.nodes[partition_id]: 1.0
        if ctx.weight_key == keys.UNIT_WEIGHT
        else float(i[keys.NUM_EXAMPLES])
        for partition_id, i in ctx.info.items()
    }
    return _selector_groups(
        ctx,
        name,
        u,
        SelectorGroups(u, 0, 0, fixed_groups=groups, fixed_weights=weights, **_group_args(ctx)),
    )


def _group_args(ctx: Context) -> dict:
    p = ctx.cfg.protocol
    return dict(
        model_prefix=keys.MODEL_PREFIX,
        loss_prefix=keys.LOSS_PREFIX,
        group_key=keys.GROUP,
        fraction_train=p.fraction_train,
        fraction_evaluate=0.0,
        min_train_nodes=1,
        min_available_nodes=1,
        weighted_by_key=ctx.weight_key,
        arrayrecord_key=keys.ARRAYS,
        configrecord_key=keys.CONFIG,
    )


def _selector_groups(ctx: Context, name: str, num_selectors: int, strategy: SelectorGroups) -> dict:
    initial = to_record(ctx.initial)
    grid = ctx.clock_grid(name, Policy(ANY, ctx.train_reply(initial)), strategy).checked(
        "regroup", keys.report_weight(ctx.declared(keys.NUM_EXAMPLES))
    )
    result = strategy.start(
        grid,
        initial,
        int(ctx.cfg.num_rounds),
        ctx.cfg.round_timeout,
        ConfigRecord(ctx.train_config()),
    )
    minority = {
        partition_id for partition_id, i in ctx.info.items() if i[keys.POPULATION] == "minority"
    }
    groups = [_group_row(g, ctx, minority, num_selectors) for g in result.groups]
    if strategy.fixed:
        groups = [
            _group_row(
                {
                    "round": 1,
                    "groups": strategy.groups,
                    "sizes": np.bincount(
                        list(strategy.groups.values()), minlength=num_selectors
                    ).tolist(),
                    "reported": 0,
                    "kept": 0,
                    "joined": 0,
                    "mean_loss": None,
                },
                ctx,
                minority,
                num_selectors,
            )
        ]
    return {
        "selectors": [from_record(s) for s in result.selectors],
        "groups": groups,
        "warmup": [from_record(s) for s in result.warmup],
        "details": {"rounds": result.train_metrics},
    }


def _group_row(g: dict, ctx: Context, minority: set[int], num_selectors: int) -> dict:
    members = [
        [ctx.partition_of(n) for n, u in g["groups"].items() if u == s]
        for s in range(num_selectors)
    ]
    return {
        "round": g["round"],
        "sizes": g["sizes"],
        "members": members,
        "minority_share": [
            sum(m in minority for m in ms) / len(ms) if ms else None for ms in members
        ],
        "reported": g["reported"],
        "kept": g["kept"],
        "joined": g["joined"],
        "mean_loss": g["mean_loss"],
    }


def evaluate_selectors(
    selector, weights: list[dict], fed: Federation, minority_share: float
) -> dict:
    """Accuracy on the held-out test pairs for each population (its own preference as label):
    of the majority vote, and of each selector alone when there are several."""
    tests = {pop: fed.test(pop) for pop in ("majority", "minority")}
    labels = {pop: np.array([e.label for e in test]) for pop, test in tests.items()}
    votes = {pop: choices(selector, weights, test) for pop, test in tests.items()}

    def scores(pred: dict[str, np.ndarray]) -> dict:
        acc = {pop: float(np.mean(pred[pop] == y)) for pop, y in labels.items()}
        return {
            "accuracy_majority": acc["majority"],
            "accuracy_minority": acc["minority"],
            "accuracy": (1 - minority_share) * acc["majority"] + minority_share * acc["minority"],
        }

    out = scores({pop: majority_vote(v) for pop, v in votes.items()})
    if len(weights) > 1:
        out["each"] = [scores({pop: v[u] for pop, v in votes.items()}) for u in range(len(weights))]
    return out


def context(messenger: Messenger, cfg: DictConfig, selector, plan: PrivacyPlan) -> Context:
    """The runners' context: every client discovered, the server's view of the data, and
    ``selector``'s weights as the initial ones (a function of its own, so that a test drives a
    runner with the messages a run sends)."""
    base = client_config(cfg)
    task = OmegaConf.to_container(cfg.task, resolve=True)
    federation = Federation(task, task["data_root"])

    def holds(partition: int) -> dict:
        """What the public partitioning gives ``partition``: what its client must declare."""
        data = federation.client(partition)
        return {
            keys.NUM_EXAMPLES: len(data.train),
            keys.NUM_VALID: len(data.valid),
            keys.POPULATION: data.population,
        }

    reply = keys.discover_reply(messenger.partition_of, holds, federation.num_clients)
    nodes, records = discover(messenger, base, reply)
    info = {
        partition_id: {k: r[k] for k in (keys.NUM_EXAMPLES, keys.NUM_VALID, keys.POPULATION)}
        for partition_id, r in records.items()
    }
    return Context(messenger, cfg, base, nodes, info, federation, selector.weights(), plan=plan)


def run(
    messenger: Messenger, cfg: DictConfig, out: RunOutput, plan: PrivacyPlan
) -> tuple[dict, str]:
    selector = instantiate(cfg.task.selector, seed=cfg.task.seed)
    ctx = context(messenger, cfg, selector, plan)
    federation, info, nodes = ctx.federation, ctx.info, ctx.nodes
    share = len(federation.minority) / federation.num_clients
    pairs = {partition_id: i[keys.NUM_EXAMPLES] for partition_id, i in info.items()}
    pair_share = sum(pairs[partition_id] for partition_id in federation.minority) / sum(
        pairs.values()
    )
    log.info(
        "[fedbiscuit] %d clients, minority %s (%.0f%% of clients, %.0f%% of training pairs); %d test "
        "pairs; p_m: %s",
        len(nodes),
        federation.minority,
        100 * share,
        100 * pair_share,
        len(federation.splits["test"]),
        cfg.protocol.client_weights,
    )
    results = {
        "clients": {str(k): v for k, v in sorted(info.items())},
        "minority": federation.minority,
        "minority_share": {"clients": share, "training_pairs": pair_share},
        "minority_preference": OmegaConf.to_container(cfg.task.minority_preference),
        "ties": federation.ties(),  # pairs each population's labels tie, dropped, per split
        "client_weights": cfg.protocol.client_weights,
        "selectors": {},
        "warmup": {},
        "groups": {},
        "regroup_faults": {},
        "communication": {},
        "methods": {},
    }
    weights = {}
    for name, spec in cfg.protocol.methods.items():
        start = time.perf_counter()
        trained = get_method(spec.run)(ctx, name, spec)
        weights[name] = trained["selectors"]
        results["selectors"][name] = evaluate_selectors(
            selector, trained["selectors"], federation, share
        )
        results["methods"][name] = {"seconds": time.perf_counter() - start, **trained["details"]}
        if "groups" in trained:
            results["groups"][name] = trained["groups"]
            results["regroup_faults"][name] = messenger.faults.get(f"{name}/regroup", {})
            _log_first_grouping(name, trained["groups"])
        if trained.get("warmup"):
            results["warmup"][name] = [
                evaluate_selectors(selector, [w], federation, share) for w in trained["warmup"]
            ]
            log.info(
                "[fedbiscuit] %s warm-up selectors, accuracy majority / minority: %s",
                name,
                ", ".join(
                    f"{w['accuracy_majority']:.3f} / {w['accuracy_minority']:.3f}"
                    for w in results["warmup"][name]
                ),
            )
        results["communication"][name] = _communication(messenger, name)
        log.info(
            "[fedbiscuit] %s: accuracy majority %.3f minority %.3f (%.0f s)",
            name,
            results["selectors"][name]["accuracy_majority"],
            results["selectors"][name]["accuracy_minority"],
            time.perf_counter() - start,
        )
    if cfg.protocol.rlhf.enabled:
        results["rlhf"] = run_rlhf(ctx, weights, selector)
        results["policy"] = results["rlhf"].pop("policy")
        results["rlhf_reference"] = cfg.protocol.rlhf.reference_method
        for name in ("fedavg", "feddpo"):
            results["communication"][f"policy_{name}"] = _communication(messenger, f"rlhf-{name}")
    return results, report.summary(results, out)


def _log_first_grouping(name: str, groups: list[dict]) -> None:
    if groups:
        log.info(
            "[fedbiscuit] %s first grouping (round %d): sizes %s, minority share %s",
            name,
            groups[0]["round"],
            groups[0]["sizes"],
            [None if x is None else round(x, 2) for x in groups[0]["minority_share"]],
        )


def _communication(messenger: Messenger, name: str) -> dict:
    def per_round(phase: str) -> float:
        rows = messenger.traffic.get(phase, {}).values()
        return float(np.mean([r["bytes_down"] + r["bytes_up"] for r in rows])) if rows else 0.0

    return {
        "bytes_per_round": per_round(f"{name}/train"),
        "regroup_bytes": per_round(f"{name}/regroup"),
    }
