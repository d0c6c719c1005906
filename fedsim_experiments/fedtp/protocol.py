"""FedTP's server-side protocol (METHODS.md section 1), run inside the ServerApp.

1. discover: every node reports which conversations (splits) it hosts;
2. prior: the configured strategy aggregates p_c of the prior clients (one-shot by default);
3. tune: validation clients route with the release under every lambda; best lambda wins;
4. test: test clients route under the four routers and every DP-sweep release, returning
   metric sums and turn-level outcomes for the paired analyses.

The DP sweep re-releases the rows the server received in step 2 under each (sigma, seed):
the server is trusted with raw p_c in this central-DP model, clients are deterministic, and each
sweep point is its own independent release (its epsilon is reported per point, not composed)
with noise of its own: two points sharing one draw would give the exact mean by subtraction.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp.strategy import Strategy
from omegaconf import DictConfig, OmegaConf

from fedsim.privacy.audit import (
    AuditReport,
    NoiseCheck,
    SharedNoise,
    audit_release,
    noise_check,
    shared_noise_check,
)
from fedsim.privacy.dp import SWEEP, Release, clipped_sum
from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import RunOutput
from fedsim.results.stats import cluster_mean_ci, gain_distribution, group_gains
from fedsim.runtime.messaging import ANY, Messenger, Policy, client_config
from fedsim.runtime.validators import Bound, Validator
from fedsim_clients import fedtp_messages as keys
from fedsim_clients.topic_preference import hosted_rows
from fedsim_experiments.common import build_strategy
from fedsim_experiments.fedtp import report
from fedsim_experiments.fedtp.settings import ROUTERS
from fedsim_tasks.topical_chat.dataset import load_topics, row_splits

log = logging.getLogger("fedsim")


# Phase policies: every phase goes on with the clients that answered (left-out ones are counted
# in results.json faults); a phase with no usable reply stops the run. What each reply must be:
# fedsim_clients/fedtp_messages.py.


def prior_policy(dim: int, max_rows: Bound = math.inf) -> Policy:
    """Train replies must be finite, non-negative (rows, dim) preference matrices of at most
    ``max_rows`` rows (per node: the conversations it hosts in the prior splits, and a DP
    strategy's bound, e.g. one row per reply under sampling)."""
    return Policy(ANY, keys.train_reply(dim, max_rows))


def check_records(hosted: dict[int, ConfigRecord], splits: list[str], strategy) -> None:
    """Refuse a DP release whose bound does not hold: a conversation held by several clients
    (more partitions than conversations resamples them) moves the sum by more than C, and under
    sampling a client holding several conversations is sampled with all of them at once."""
    if not getattr(strategy, "noise_multiplier", 0):
        return
    held = [
        [r for r, s in zip(info[keys.INFO_ROWS], info[keys.INFO_SPLITS]) if s in splits]
        for info in hosted.values()
    ]
    rows = [r for node in held for r in node]
    if len(rows) != len(set(rows)):
        raise ValueError(
            f"DP: {len(rows) - len(set(rows))} conversation(s) reach several clients "
            "(more partitions than conversations); a record's influence would exceed "
            "the clip norm. Use at most one client per conversation."
        )
    most, limit = max(map(len, held), default=0), strategy.max_rows_per_reply
    if limit is not None and most > limit:
        raise ValueError(
            f"DP: a client holds {most} conversations, at most {limit} allowed "
            "under client sampling (fraction_train < 1): give each conversation a "
            "client of its own (hardware.num_supernodes or clients_per_supernode)"
        )


def sweep_releases(strategy, sigmas: list[float], seeds: int) -> dict[str, tuple[float, Release]]:
    """The DP sweep: ``seeds`` releases of the received rows per sigma, each with a noise stream
    of its own (``SWEEP, sigma index, seed index``): name -> (sigma, release)."""
    return {
        f"dp/{float(sigma)}/{k}": (
            float(sigma),
            strategy.release(strategy.received, float(sigma), (SWEEP, i, k)),
        )
        for i, sigma in enumerate(sigmas)
        for k in range(seeds)
    }


def sweep_priors(strategy, sigmas: list[float], seeds: int) -> dict[str, tuple[float, np.ndarray]]:
    """The DP sweep's released priors: name -> (sigma, released prior)."""
    return {
        name: (sigma, release.mean)
        for name, (sigma, release) in sweep_releases(strategy, sigmas, seeds).items()
    }


AUDIT_COVERS = (
    "FedTP's DP prior: canary clients beside the prior clients, each a row C e_t on a topic t of "
    "its own or the zero row, on its coin, in the prior release and in every sweep release of the "
    "same rows; these releases, and every routing result of this run, carry the canaries. The "
    "canaries' bound covers the prior and each sigma's first sweep release; the noise check, every "
    "release with noise, each alone and all together"
)


def audit_releases(cfg: DictConfig, plan: PrivacyPlan, strategy, prior: np.ndarray) -> AuditReport:
    """The audit run's releases. Canaries: the prior and each sigma's first sweep release, each
    against its own accountant; the attacker knows the prior clients' rows and the public seed
    (its guess of each release's noise: ``plan.seed_noise``), not the coins nor the run's secret
    noise. Noise: the prior and every sweep release with noise, each release's noise (its noised
    mean times the divisor, minus the exact clipped sum the server holds) against its sigma, and
    all of them against each other. The run's confidence is split over every check."""
    settings = cfg.privacy.audit
    sigmas = [float(sigma) for sigma in cfg.protocol.dp_sigmas]
    sweep = sweep_releases(strategy, sigmas, int(cfg.protocol.dp_seeds))
    canary = [("prior", strategy.noise_multiplier, prior, strategy.last_release)]
    canary += [
        (name, sigma, sweep[name][1].mean, sweep[name][1])
        for sigma in sigmas
        if (name := f"dp/{sigma}/0") in sweep
    ]
    noised = {
        name: (sigma, release.noised)
        for name, (sigma, release) in {
            "prior": (strategy.noise_multiplier, strategy.last_release),
            **sweep,
        }.items()
        if sigma > 0
    }
    significance = (1 - float(settings.confidence)) / (
        len(canary) + len(noised) + (len(noised) > 1)
    )
    bounds = []
    for name, sigma, released, release in canary:
        bounds.append(
            audit_release(
                name,
                sigma,
                strategy.canaries.attacks(released, strategy.simplex, plan.seed_noise(release)),
                strategy.canaries.included,
                strategy.epsilon(sigma).reported,
                strategy.delta,
                significance,
                float(settings.confidence),
                list(settings.guess_shares),
            )
        )
    return AuditReport(bounds, AUDIT_COVERS, *noise_checks(strategy, noised, significance))


def noise_checks(
    strategy, noised: dict[str, tuple[float, np.ndarray]], significance: float
) -> tuple[list[NoiseCheck], SharedNoise | None]:
    """Each release's noise (``noised``: name -> (sigma, noised mean before the simplex step))
    against its sigma, and all of them against each other, each check at ``significance``. The
    noise is the noised mean times the divisor minus the exact clipped sum of the rows the
    strategy received, which the server holds."""
    exact = clipped_sum(strategy.received, strategy.clip_norm, strategy.simplex)
    divisor = strategy.denominator or len(strategy.received)
    residuals = {
        name: (mean * divisor - exact) / strategy.clip_norm for name, (_, mean) in noised.items()
    }
    checks = [noise_check(name, noised[name][0], r, significance) for name, r in residuals.items()]
    shared = (
        shared_noise_check(
            list(residuals),
            np.stack([r / noised[n][0] for n, r in residuals.items()]),
            significance,
        )
        if len(residuals) > 1
        else None
    )
    return checks, shared


def _broadcast(
    messenger: Messenger,
    phase: str,
    nodes: list[int],
    message_type: str,
    content: RecordDict,
    reply: Validator,
) -> list[Message]:
    return messenger.exchange(
        phase,
        [Message(content, dst_node_id=n, message_type=message_type) for n in nodes],
        Policy(ANY, reply),
    )


def _sum_metrics(replies: list[Message]) -> tuple[dict, dict]:
    """Federated sums of scalar metrics; turn-level lists ordered by conversation row, so the
    bootstrap does not depend on the order replies arrived in."""
    sums, turns = {}, {}
    for msg in replies:
        for key, value in msg.content[keys.METRICS].items():
            if key.startswith(keys.TURN_PREFIX):
                turns.setdefault(key.removeprefix(keys.TURN_PREFIX), []).extend(value)
            else:
                sums[key] = sums.get(key, 0) + value
    if not turns:
        return sums, {}
    order = np.argsort(turns["row"], kind="stable")
    return sums, {k: np.asarray(v)[order] for k, v in turns.items()}


def _scores(sums: dict, splits: list[str], variant: str) -> dict:
    """turns, ehr, err, support_ratio of one variant over ``splits`` from the federated sums."""
    turns = sum(sums.get(f"{s}/turns", 0) for s in splits)
    total = {
        m: sum(sums.get(f"{s}/{variant}/{m}", 0) for s in splits)
        for m in ("hits", "err", "support")
    }
    if turns == 0:
        return {"turns": 0, "ehr": None, "err": None, "support_ratio": None}
    return {
        "turns": int(turns),
        "ehr": total["hits"] / turns,
        "err": total["err"] / turns,
        "support_ratio": total["support"] / turns,
    }


def _evaluate_content(
    priors: dict, variants: list[tuple], splits: list[str], base: dict, turn_level: bool
) -> RecordDict:
    names, prior_keys, alphas, lams = (list(x) for x in zip(*variants))
    return RecordDict(
        {
            keys.PRIORS: ArrayRecord({k: Array(np.asarray(v, float)) for k, v in priors.items()}),
            keys.CONFIG: ConfigRecord(
                {
                    **base,
                    keys.SPLITS: splits,
                    keys.TURN_LEVEL: turn_level,
                    keys.VARIANT_NAMES: names,
                    keys.VARIANT_PRIORS: prior_keys,
                    keys.VARIANT_ALPHAS: [float(a) for a in alphas],
                    keys.VARIANT_LAMBDAS: [float(x) for x in lams],
                }
            ),
        }
    )


def discover(
    messenger: Messenger, base: dict, splits: list[str] | None = None
) -> dict[int, ConfigRecord]:
    """Which conversations (rows, splits) each node hosts: exactly those the public partitioning of
    the population gives its partition (the one it told at ``whoami``; ``splits``: the split of
    each population row), so that no node claims more conversations, and more weight, than it
    holds."""
    nodes = messenger.node_ids()
    log.info("FedTP: %d SuperNodes connected", len(nodes))
    partitions = (
        messenger.num_partitions
    )  # once: it lists every node (per reply it made discovery quadratic)

    def hosted(partition: int) -> tuple[list[int], list[str]] | None:
        if splits is None:
            return None
        rows = hosted_rows(len(splits), partitions, partition)
        return rows, [splits[r] for r in rows]

    reply = keys.discover_reply(messenger.partition_of, partitions, hosted)
    infos = _broadcast(
        messenger,
        "discover",
        nodes,
        MessageType.QUERY,
        RecordDict({keys.CONFIG: ConfigRecord(base)}),
        reply,
    )
    return {m.metadata.src_node_id: m.content[keys.INFO] for m in infos}


@dataclass
class Context:
    """What every phase reads: the run's messenger, config, client config entries, task block,
    strategy, and which conversations each node hosts."""

    messenger: Messenger
    cfg: DictConfig
    base: dict
    task: dict
    strategy: Strategy
    hosted: dict[int, ConfigRecord]

    def holders(self, splits: list[str]) -> list[int]:
        """The nodes hosting any of ``splits``, in the messenger's node order (as discovered)."""
        return [n for n, info in self.hosted.items() if set(info[keys.INFO_SPLITS]) & set(splits)]

    def rows_in(self, splits: list[str]) -> Callable[[int], int]:
        """How many of its conversations each node hosts in ``splits``: the most rows, and the
        most weight, its reply may carry."""
        return lambda node: sum(s in splits for s in self.hosted[node][keys.INFO_SPLITS])

    def rows_of(self, node: int) -> list[int]:
        return list(self.hosted[node][keys.INFO_ROWS])

    def evaluate_reply(self, splits: list[str], content: RecordDict, topics: int) -> Validator:
        """What an evaluation of ``content`` (its splits, variants, turn level) must answer."""
        config = content[keys.CONFIG]
        return keys.evaluate_reply(
            splits,
            list(config[keys.VARIANT_NAMES]),
            bool(config[keys.TURN_LEVEL]),
            topics,
            self.rows_of,
        )


@dataclass
class Prior:
    """Step 2's outcome: the released prior and who it came from."""

    vector: np.ndarray
    nodes: int  # SuperNodes hosting a prior split
    examples: int  # accepted replies' examples in the last round
    train_metrics: dict


def train_prior(ctx: Context, num_topics: int) -> Prior:
    """The configured strategy aggregates p_c of the prior clients, starting from uniform."""
    splits = ctx.task["prior_splits"]
    nodes = ctx.holders(splits)
    if not nodes:
        raise RuntimeError(f"no SuperNode hosts a prior split {splits}")
    check_records(ctx.hosted, splits, ctx.strategy)
    uniform = np.full(num_topics, 1.0 / num_topics)
    hosted, cap = ctx.rows_in(splits), getattr(ctx.strategy, "max_rows_per_reply", None) or math.inf
    policy = prior_policy(num_topics, lambda node: min(hosted(node), cap))
    rounds = int(ctx.cfg.num_rounds)
    result = ctx.strategy.start(
        ctx.messenger.grid("prior", policy, nodes),
        initial_arrays=ArrayRecord({keys.VECTORS: Array(uniform)}),
        num_rounds=rounds,
        timeout=float(ctx.cfg.round_timeout),
        train_config=ConfigRecord({**ctx.base, keys.SPLITS: splits}),
    )
    last = ctx.messenger.faults["prior/train"][rounds]
    log.info("FedTP: prior released from %d accepted replies", last["accepted"])
    return Prior(
        result.arrays[keys.VECTORS].numpy().reshape(-1),
        len(nodes),
        last["examples"],
        {r: dict(m) for r, m in result.train_metrics_clientapp.items()},
    )


def tune_lambda(ctx: Context, prior: np.ndarray) -> tuple[list[dict], float]:
    """The validation clients route with FedMix under every lambda: the sweep's rows and the
    lambda of the best EHR."""
    alpha, lambdas = float(ctx.cfg.protocol.alpha), [float(x) for x in ctx.cfg.protocol.lambdas]
    tune = ctx.task["tune_splits"]
    content = _evaluate_content(
        {"main": prior},
        [(f"fedmix@{lam}", "main", alpha, lam) for lam in lambdas],
        tune,
        ctx.base,
        False,
    )
    sums, _ = _sum_metrics(
        _broadcast(
            ctx.messenger,
            "tune",
            ctx.holders(tune),
            MessageType.EVALUATE,
            content,
            ctx.evaluate_reply(tune, content, len(prior)),
        )
    )
    lambda_sweep = [{"lambda": lam, **_scores(sums, tune, f"fedmix@{lam}")} for lam in lambdas]
    best = max(lambda_sweep, key=lambda r: r["ehr"] or 0.0)["lambda"]
    log.info(
        "FedTP: lambda sweep %s -> lambda=%g", [(r["lambda"], r["ehr"]) for r in lambda_sweep], best
    )
    return lambda_sweep, best


def evaluate_routers(
    ctx: Context, prior: np.ndarray, best: float
) -> tuple[dict, dict, dict[float, list[str]]]:
    """The test clients route under the four routers and every DP-sweep release: the metric
    sums, the turn-level outcomes and the sweep's variant names by sigma."""
    alpha = float(ctx.cfg.protocol.alpha)
    priors = {"main": prior}
    variants = [
        ("tfidf", "", 0.0, 0.0),
        ("global", "main", 1.0, best),
        ("local", "", 0.0, best),
        ("fedmix", "main", alpha, best),
    ]
    sweep_keys = {}
    releasable = hasattr(ctx.strategy, "release") and ctx.strategy.received is not None
    sweep = (
        sweep_priors(ctx.strategy, list(ctx.cfg.protocol.dp_sigmas), int(ctx.cfg.protocol.dp_seeds))
        if releasable
        else {}
    )
    for name, (sigma, released) in sweep.items():
        priors[name] = released
        variants.append((name, name, alpha, best))
        sweep_keys.setdefault(sigma, []).append(name)
    test = ctx.task["test_splits"]
    content = _evaluate_content(priors, variants, test, ctx.base, True)
    sums, turns = _sum_metrics(
        _broadcast(
            ctx.messenger,
            "test",
            ctx.holders(test),
            MessageType.EVALUATE,
            content,
            ctx.evaluate_reply(test, content, len(prior)),
        )
    )
    return sums, turns, sweep_keys


def _dp_sweep(
    strategy, sums: dict, test: list[str], sweep_keys: dict[float, list[str]]
) -> list[dict]:
    """Per sigma: its privacy (one-shot and RDP epsilon) and the test EHR over its seeds."""
    rows = []
    for sigma, names in sweep_keys.items():
        ehrs = [_scores(sums, test, n)["ehr"] for n in names]
        rows.append(
            {
                "sigma": sigma,
                **_epsilons(strategy, sigma),
                "delta": strategy.delta,
                "ehr_mean": float(np.mean(ehrs)),
                "ehr_std": float(np.std(ehrs, ddof=1)) if len(ehrs) > 1 else 0.0,
                "seeds": len(names),
                "ehr_per_seed": ehrs,
            }
        )
    return rows


def _epsilons(strategy, sigma: float) -> dict:
    """One sweep point's epsilon (the smaller of its two accountants) and each accountant's."""
    spent = strategy.epsilon(sigma)
    return {"epsilon": spent.reported, "epsilon_rdp": spent.rdp, "epsilon_pld": spent.pld}


def _paired_analyses(turns: dict, unit: str, resamples: int, seed: int) -> tuple[dict, np.ndarray]:
    """FedMix against TF-IDF turn by turn: the EHR gain and its paired bootstrap CI over
    conversations (``task.unit``: a conversation's turns share its prior and candidates), the
    routing decisions changed, the ambiguous turns, and the per-conversation gains; and the
    ablation, FedMix against the global prior alone (does mixing in the local prior add anything?),
    over the same conversations."""
    hit = {
        r: (turns[f"pick/{r}"] == turns["gold"]).astype(float)
        for r in ("tfidf", "global", "fedmix")
    }
    amb = turns["ambiguous"].astype(bool)
    gains = group_gains(turns["row"], hit["tfidf"], hit["fedmix"])
    changed = int(np.sum(turns["pick/fedmix"] != turns["pick/tfidf"]))
    return {
        "bootstrap_ci_ehr_gain": list(
            cluster_mean_ci(hit["fedmix"] - hit["tfidf"], turns["row"], resamples, seed)
        ),
        "bootstrap_ci_ehr_gain_unit": {"unit": unit, "clusters": int(gains.size)},
        "ehr_gain": float(np.mean(hit["fedmix"] - hit["tfidf"])),
        "bootstrap_ci_ehr_gain_over_global": list(
            cluster_mean_ci(hit["fedmix"] - hit["global"], turns["row"], resamples, seed)
        ),
        "ehr_gain_over_global": float(np.mean(hit["fedmix"] - hit["global"])),
        "changed_decisions": {
            "count": changed,
            "turns": int(amb.size),
            "share": changed / amb.size if amb.size else 0.0,
        },
        "ambiguous": {
            "turns": int(amb.sum()),
            "ehr_tfidf": float(hit["tfidf"][amb].mean()) if amb.any() else None,
            "ehr_fedmix": float(hit["fedmix"][amb].mean()) if amb.any() else None,
        },
        "per_conversation_gain": gain_distribution(gains),
    }, gains


def _timed(timings: dict, name: str, phase, *args):
    """``phase(*args)``, its wall time recorded as ``timings[name]``."""
    t0 = time.monotonic()
    out = phase(*args)
    timings[name] = time.monotonic() - t0
    return out


def run(
    messenger: Messenger, cfg: DictConfig, out: RunOutput, plan: PrivacyPlan
) -> tuple[dict, str]:
    proto = cfg.protocol
    timings, t_all = {}, time.monotonic()
    num_topics = len(load_topics(cfg.data_root))
    base = client_config(cfg)
    supernodes = len(messenger.node_ids())
    strategy = build_strategy(cfg, plan, supernodes)
    splits = row_splits(cfg.data_root, tuple(cfg.task.splits), cfg.task.get("max_per_split"))
    hosted = _timed(timings, "discover_s", discover, messenger, base, splits)
    ctx = Context(
        messenger, cfg, base, OmegaConf.to_container(cfg.task, resolve=True), strategy, hosted
    )
    prior = _timed(timings, "prior_s", train_prior, ctx, num_topics)
    lambda_sweep, best = _timed(timings, "tune_s", tune_lambda, ctx, prior.vector)
    sums, turns, sweep_keys = _timed(timings, "test_s", evaluate_routers, ctx, prior.vector, best)
    test = ctx.task["test_splits"]
    analyses, gains = _paired_analyses(turns, cfg.task.unit, int(proto.bootstrap), int(cfg.seed))
    dp_sweep = _dp_sweep(strategy, sums, test, sweep_keys)
    audit = audit_releases(cfg, plan, strategy, prior.vector) if cfg.privacy.audit.enabled else None
    timings["total_s"] = time.monotonic() - t_all
    results = {
        "experiment": proto.name,
        "lambda": best,
        "alpha": float(proto.alpha),
        "noise_multiplier": float(cfg.strategy.get("noise_multiplier", 0.0)),
        "strategy": cfg.strategy._target_,
        "prior_clients": {
            "splits": ctx.task["prior_splits"],
            "count": prior.examples,
            "nodes": prior.nodes,
        },
        "supernodes": supernodes,
        "conversations": len({r for info in hosted.values() for r in info[keys.INFO_ROWS]}),
        "routers": {
            r: {**{s: _scores(sums, [s], r) for s in test}, "overall": _scores(sums, test, r)}
            for r in ROUTERS
        },
        "lambda_sweep": lambda_sweep,
        "dp_sweep": dp_sweep,
        **analyses,
        "train_metrics": prior.train_metrics,
        "faults": messenger.faults,
        "timings": timings,
        **({"audit": audit} if audit else {}),
    }
    report.plots(out, results, gains)
    return results, report.summary(results, test)
