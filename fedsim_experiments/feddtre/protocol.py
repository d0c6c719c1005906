"""FedDTRE's experiment protocol (METHODS.md section 2), run inside the ServerApp.

1. A base generator taught to answer: the configured causal LM (offline: the warm-started
   MiniLM decoder) fine-tuned once on Topical-Chat, a dialogue corpus no client holds (the
   paper starts from a chat model), saved under ``generator.base_dir``.
2. The trust evaluator, trained federatedly (Flower FedAvg) on the clients' trust data; its AUC
   on held-out trust pairs of each dataset before and after.
3. For each dataset and each method of ``protocol.methods`` (each names its runner and, for the
   federated ones, its Flower strategy: FedAvg, FedProx, TrustAlpha with a fixed alpha or the
   trust schedule): the generator's adapters.
4. Every method's generator answers the dataset's held-out contexts: BLEU-1/4, ROUGE-1/2 against
   the true replies and the mean trust score of its replies.
5. After each federated method's rounds, every client evaluates its personalized model (its own
   W_local under a mixing, else the global) and the global model on its own held-out contexts
   and sends back metrics only: their spread over clients and the paired gains.
With ``task.contamination``, the contaminated clients' alphas, trust scores and PII rates are
set beside the clean clients'.
Settings and checks: ``settings.py``; tables and plots: ``report.py``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf

from fedsim.config.schema import check
from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import RunOutput
from fedsim.runtime.messaging import ANY, Messenger, Policy, client_config
from fedsim.runtime.records import from_record, to_bytes, to_record
from fedsim.seeding import stream
from fedsim_clients import feddtre_messages as keys
from fedsim_experiments.common import RunContext, build_strategy, discover, innermost
from fedsim_experiments.feddtre.report import (
    alpha_rows,
    alpha_vs_gap,
    communication,
    contamination_rows,
    spread,
    summary,
)
from fedsim_experiments.feddtre.settings import (
    BASE_HELDOUT_SPLIT,
    BASE_TRAIN_SPLITS,
    FedDTREProtocol,
    Generator,
)
from fedsim_tasks.causal_lm import load_policy, load_tokenizer, saved_sft_base, turn_separator
from fedsim_tasks.dialogue.dataset import (
    DialogueTask,
    answer_sample,
    contamination,
    examples,
    load_tasks,
    topical_chat,
)
from fedsim_tasks.dialogue.metrics import REPLY_METRICS, reply_scores
from fedsim_tasks.dialogue.trust_data import trust_examples
from fedsim_tasks.hf import load_trainable, trainable_arrays

log = logging.getLogger("fedsim")
HELD_OUT_TRUST = stream(
    "held-out-trust-data", "dataset"
)  # of the split seed: the evaluator's AUC pairs
TEST_CONTEXTS = stream(
    "test-contexts", "dataset"
)  # of the split seed: the final evaluation's contexts
TEST_SAMPLING = stream(
    "test-sampling", "dataset"
)  # of the run's seed: its replies (the same for every method)


@dataclass
class Context(RunContext):
    """A FedDTRE runner's context: the shared one, the settings and the base adapters."""

    protocol: FedDTREProtocol
    tasks: dict[str, DialogueTask]
    base_path: str
    initial: dict  # the adapters' initial weights (a zero LoRA update: the base)
    evaluator_blob: bytes = b""  # the trained evaluator's weights, sent with trust mixing

    def trust_examples(self, node: int) -> float:
        """The trust examples a client holds: 3 per sampled context of each dataset (the most
        weight its evaluator reply carries)."""
        contexts, info = (
            int(self.cfg.task.trust.contexts_per_client),
            self.info[self.partition_of(node)],
        )
        return float(sum(3 * min(contexts, info[keys.EXAMPLES_PREFIX + d]) for d in self.tasks))

    def generator_config(self, dataset: str, method: str) -> dict:
        g = self.protocol.generator
        settings = {**asdict(g), "base": self.base_path, "rounds": int(self.cfg.num_rounds)}
        return {
            **self.base,
            keys.OBJECTIVE: keys.GENERATOR,
            keys.DATASET: dataset,
            keys.LOCAL_MODEL: re.sub(r"[^A-Za-z0-9._-]", "_", f"generator-{dataset}-{method}"),
            keys.SETTINGS: json.dumps(settings),
            keys.LOCAL_STEPS: g.local_steps,
            keys.BATCH_SIZE: g.batch_size,
            keys.SEED: int(self.cfg.seed),
            keys.TORCH_THREADS: 1,
        }


def base(ctx: Context, name: str, spec: DictConfig, dataset: str) -> dict:
    """No training: the base generator (its adapters are a zero update)."""
    return {"weights": ctx.initial}


def federated(ctx: Context, name: str, spec: DictConfig, dataset: str) -> dict:
    """The method's Flower strategy (``spec.strategy``) over ``clients_per_round`` clients per
    round; replies need finite weights (and, under mixing, an alpha in [0, 1])."""
    n = ctx.protocol.clients_per_round  # the fraction may round down; min_train_nodes restores n
    strategy = build_strategy(
        ctx.cfg,
        ctx.plan,
        len(ctx.nodes),
        spec.get("strategy"),
        fraction_train=n / len(ctx.nodes),
        fraction_evaluate=0.0,
        min_train_nodes=n,
        min_available_nodes=n,
        weighted_by_key=keys.NUM_EXAMPLES,
        arrayrecord_key=keys.ARRAYS,
        configrecord_key=keys.CONFIG,
    )
    own = innermost(
        strategy
    )  # what the method's own strategy records (alphas), inside any privacy wrapper
    config = {**ctx.generator_config(dataset, name), keys.DP_ACCOUNT: f"{dataset}-{name}"}
    if getattr(own, "scores_trust", False):
        config[keys.EVALUATOR_WEIGHTS] = ctx.evaluator_blob
    initial = to_record(ctx.initial)
    scores = ctx.protocol.generator.eval_contexts if getattr(own, "scores_trust", False) else 0
    reply = keys.train_reply(
        initial,
        ctx.declared(keys.EXAMPLES_PREFIX + dataset),
        ctx.cfg.protocol.strategy_slot.loss_key,
        mixing=hasattr(own, "alphas"),
        trust=scores,
        loss_gap=ctx.protocol.generator.gap_examples() > 0,
    )
    result = strategy.start(
        ctx.clock_grid(f"{dataset}/{name}", Policy(ANY, reply), strategy),
        initial,
        int(ctx.cfg.num_rounds),
        ctx.cfg.round_timeout,
        ConfigRecord(config),
    )
    out = {
        "weights": from_record(result.arrays),
        "strategy": _strategy_name(strategy),
        "rounds": {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()},
    }
    if hasattr(own, "alphas"):  # by partition: node ids are random per run
        out["alphas"] = {
            r: [{"partition": ctx.partition_of(row.pop("node")), **row} for row in rows]
            for r, rows in own.alphas.items()
        }
    out["personalized"] = evaluate_personalized(ctx, name, dataset, result.arrays)
    return out


def _strategy_name(strategy) -> str:
    """The strategy's class inside its wrappers: ``FedAdam``, ``FedAvg in NumpyNoise(Differential...)``."""
    names = []
    while strategy is not None:
        names.append(type(strategy).__name__)
        strategy = getattr(strategy, "strategy", None)
    return " in ".join(reversed(names))


def evaluate_personalized(ctx: Context, name: str, dataset: str, global_arrays) -> dict:
    """One evaluate message to every client: its personalized model and the final global
    model on its own held-out contexts (``personal_contexts``, with the final evaluation's
    decoding). The evaluator's weights travel with it; metrics come back, never weights. A
    client that fails or answers malformed metrics is counted in ``faults`` and left out."""
    rounds = int(ctx.cfg.num_rounds)
    config = ConfigRecord(
        {
            **ctx.generator_config(dataset, name),
            keys.EVALUATOR_WEIGHTS: ctx.evaluator_blob,
            keys.PERSONAL_CONTEXTS: ctx.protocol.personal_contexts,
            keys.SERVER_ROUND: rounds + 1,
        }
    )  # the newest W_local is the last round's
    messages = [
        Message(
            RecordDict({keys.CONFIG: config, keys.ARRAYS: global_arrays}),
            dst_node_id=ctx.nodes[p],
            message_type=MessageType.EVALUATE,
        )
        for p in sorted(ctx.nodes)
    ]
    replies = ctx.messenger.exchange(
        f"{dataset}/{name}/personal", messages, Policy(ANY, keys.personal_reply()), rounds + 1
    )
    return _personalized(
        {ctx.partition_of(m.metadata.src_node_id): m.content[keys.METRICS] for m in replies}
    )


def _personalized(metrics: dict[int, dict]) -> dict:
    """Per client (by partition): its personalized model's metrics, the global model's on the
    same contexts (``global_<metric>``) and the paired gain (``gain_<metric>``: personalized
    minus global); each number's mean, std (over clients, ddof 1), min and max."""
    rows = []
    for partition, m in sorted(metrics.items()):
        rows.append(
            {
                "partition": partition,
                "kept_local": bool(m[keys.KEPT_LOCAL]),
                "contexts": int(m[keys.CONTEXTS]),
                "distance_to_global": float(m[keys.DISTANCE]),
                **{k: float(m[keys.PERSONAL + k]) for k in REPLY_METRICS},
                **{f"global_{k}": float(m[keys.GLOBAL + k]) for k in REPLY_METRICS},
                **{
                    f"gain_{k}": float(m[keys.PERSONAL + k] - m[keys.GLOBAL + k])
                    for k in REPLY_METRICS
                },
            }
        )
    numbers = [k for k in rows[0] if k not in ("partition", "kept_local", "contexts")]
    return {k: spread([r[k] for r in rows]) for k in numbers} | {"clients": rows}


def base_generator(g: Generator, data_root: str, seed: int) -> tuple[str, dict]:
    """The generator's base, taught to answer on Topical-Chat (valid), its held-out loss on
    Topical-Chat test_freq: built once per settings and reused."""
    key = {
        k: getattr(g, k)
        for k in (
            "model",
            "base_sft_steps",
            "base_sft_batch_size",
            "base_sft_lr",
            "base_heldout",
            "max_length",
        )
    } | {"seed": seed, "corpus": "topical_chat"}

    def data(sep: str):
        train = [
            e
            for split in BASE_TRAIN_SPLITS
            for e in examples(topical_chat(data_root, split), sep, 2, 0)
        ]
        held_out = examples(topical_chat(data_root, BASE_HELDOUT_SPLIT), sep, 2, 0)[
            : g.base_heldout
        ]
        return (
            [(e.prompt, e.reply) for e in train],
            [(e.prompt, e.reply) for e in held_out],
            {
                "data": "Topical-Chat valid_freq + valid_rare (every reply, 2 turns of context)",
                "heldout": f"Topical-Chat test_freq, {len(held_out)} replies",
            },
        )

    path, record = saved_sft_base(
        g.model,
        g.base_dir,
        key,
        data,
        steps=g.base_sft_steps,
        batch_size=g.base_sft_batch_size,
        lr=g.base_sft_lr,
        max_length=g.max_length,
        seed=seed,
    )
    return str(path), record


def train_evaluator(ctx: Context, evaluator) -> dict:
    """AUC on held-out trust pairs of every dataset, federated fine-tuning (FedAvg), AUC again."""
    e, task = ctx.protocol.evaluator, ctx.cfg.task
    held_out = {
        name: trust_examples(
            d.examples(d.trust_heldout, " [SEP] "),
            e.heldout_contexts,
            HELD_OUT_TRUST.seed(task.split_seed, dataset=name),
            dict(task.trust.labels),
        )
        for name, d in ctx.tasks.items()
    }
    held_out["all"] = [x for name in ctx.tasks for x in held_out[name]]
    before = {name: evaluator.auc(x) for name, x in held_out.items()}
    log.info(
        "[feddtre] trust evaluator AUC before: %.3f; training %d rounds",
        before["all"]["auc"],
        e.rounds,
    )
    start = time.perf_counter()
    config = {
        **ctx.base,
        keys.OBJECTIVE: keys.EVALUATOR,
        keys.LOCAL_STEPS: e.local_steps,
        keys.BATCH_SIZE: e.batch_size,
        keys.LR: e.lr,
        keys.SEED: int(ctx.cfg.seed),
        keys.TORCH_THREADS: 1,
    }
    loss_key = ctx.cfg.protocol.strategy_slot.loss_key
    result = ctx.fedavg(
        "evaluator",
        to_record(evaluator.weights()),
        e.rounds,
        config,
        e.clients_per_round / len(ctx.nodes),
        lambda sent: keys.train_reply(sent, ctx.trust_examples, loss_key),
        entry=e.strategy,
    )
    evaluator.load(from_record(result.arrays))
    after = {name: evaluator.auc(x) for name, x in held_out.items()}
    log.info("[feddtre] trust evaluator AUC after: %.3f", after["all"]["auc"])
    return {
        "auc_before": before["all"]["auc"],
        "auc_after": after["all"]["auc"],
        "before": before,
        "after": after,
        "seconds": time.perf_counter() - start,
        "rounds": {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()},
    }


def evaluate_generator(
    ctx: Context, weights: dict, dataset: str, evaluator, model, tokenizer
) -> dict:
    """Replies to the dataset's held-out contexts (seeded sampling): BLEU, ROUGE, trust score."""
    g, d = ctx.protocol.generator, ctx.tasks[dataset]
    load_trainable(model, weights)
    chosen, replies = answer_sample(
        model,
        tokenizer,
        d.examples(d.test, turn_separator(tokenizer)),
        ctx.protocol.test_contexts,
        TEST_CONTEXTS.seed(ctx.cfg.task.split_seed, dataset=dataset),
        {"max_new_tokens": g.max_new_tokens, "temperature": g.temperature, "top_p": g.top_p},
        TEST_SAMPLING.seed(ctx.cfg.seed, dataset=dataset),
    )
    return {
        **reply_scores(replies, chosen, evaluator),
        "contexts": len(chosen),
        "example": {"context": chosen[0].prompt, "reply": replies[0], "true": chosen[0].reply},
    }


def context(
    messenger: Messenger,
    cfg: DictConfig,
    protocol: FedDTREProtocol,
    base_path: str,
    model,
    plan: PrivacyPlan,
) -> Context:
    """The runners' context: every client discovered, the task's datasets, the base generator at
    ``base_path`` and the initial weights of ``model``'s adapters (a function of its own, so that a
    test drives a runner with the messages a run sends)."""
    base_cfg = client_config(cfg)
    task = OmegaConf.to_container(cfg.task, resolve=True)
    tasks = load_tasks(task, task["data_root"])

    def holds(partition: int) -> dict[str, int]:
        """Each dataset's training examples the public partitioning gives ``partition``."""
        return {
            name: len(d.examples(d.client(partition).train, " [SEP] ")) for name, d in tasks.items()
        }

    reply = keys.discover_reply(
        messenger.partition_of, list(tasks), holds, int(cfg.task.num_clients)
    )
    if why := protocol.context_shortfall(task, tasks):  # a run started without the CLI's checks
        raise ValueError(why)
    nodes, info = discover(messenger, base_cfg, reply)
    return Context(
        messenger,
        cfg,
        base_cfg,
        nodes,
        {p: dict(i) for p, i in info.items()},
        protocol,
        tasks,
        base_path,
        trainable_arrays(model),
        plan=plan,
    )


def run(
    messenger: Messenger, cfg: DictConfig, out: RunOutput, plan: PrivacyPlan
) -> tuple[dict, str]:
    protocol = check(cfg)  # the protocol block as its typed dataclass
    task = OmegaConf.to_container(cfg.task, resolve=True)
    g = protocol.generator
    start = time.perf_counter()
    base_seed = int(cfg.seed if g.base_seed is None else g.base_seed)
    base_path, base_record = base_generator(g, task["data_root"], base_seed)
    model = load_policy(base_path, dict(g.lora), int(cfg.task.seed), g.quantization)
    tokenizer = load_tokenizer(base_path)
    base_seconds = time.perf_counter() - start
    ctx = context(messenger, cfg, protocol, base_path, model, plan)
    results = {
        "clients": {str(p): dict(i) for p, i in sorted(ctx.info.items())},
        "data": {
            name: {
                "train": f"{d.spec['train_split']} split ({len(d.train)} conversations)",
                "evaluation": f"{d.spec['eval_split']} split: {len(d.trust_heldout)} conversations "
                f"for trust pairs, {len(d.test)} for generation contexts",
            }
            for name, d in ctx.tasks.items()
        },
        "base": {"path": base_path, "sft": base_record, "seconds": base_seconds},
    }
    evaluator = instantiate(cfg.task.evaluator, seed=int(cfg.task.seed))
    results["evaluator"] = train_evaluator(ctx, evaluator)
    ctx.evaluator_blob = to_bytes(evaluator.weights())
    results |= {"methods": {}, "alpha": {}, "rounds": {}, "communication": {}}
    contaminated, share = contamination(task)
    if contaminated:
        results["contamination"] = {"clients": sorted(contaminated), "share": share, "methods": {}}
    for dataset in ctx.tasks:
        for name, spec in protocol.methods.items():
            if spec is None:  # a preset's method turned off
                continue
            start = time.perf_counter()
            trained = get_method(spec["run"])(ctx, name, OmegaConf.create(spec), dataset)
            scores = evaluate_generator(
                ctx, trained["weights"], dataset, evaluator, model, tokenizer
            )
            personal = (
                {"personalized": trained["personalized"]} if "personalized" in trained else {}
            )
            ran = {"strategy": trained["strategy"]} if "strategy" in trained else {}
            results["methods"].setdefault(name, {})[dataset] = {
                **scores,
                **personal,
                **ran,
                "seconds": time.perf_counter() - start,
            }
            results["rounds"].setdefault(name, {})[dataset] = trained.get("rounds", {})
            if "alphas" in trained:
                results["alpha"].setdefault(name, {})[dataset] = alpha_rows(trained["alphas"])
                results.setdefault("alpha_gap", {}).setdefault(name, {})[dataset] = alpha_vs_gap(
                    trained["alphas"], cfg.task.unit, int(cfg.seed)
                )
            if contaminated and personal:
                results["contamination"]["methods"].setdefault(name, {})[dataset] = (
                    contamination_rows(trained, contaminated, protocol.alpha_gap_from_round)
                )
            results["communication"].setdefault(name, {})[dataset] = communication(
                messenger, f"{dataset}/{name}"
            )
            log.info(
                "[feddtre] %s / %s: BLEU-1 %.2f ROUGE-1 %.2f trust %.3f (%.0f s)",
                dataset,
                name,
                scores["bleu1"],
                scores["rouge1"],
                scores["trust_bertscore"],
                time.perf_counter() - start,
            )
    return results, summary(results, out)
