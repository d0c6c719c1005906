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
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig, OmegaConf
from scipy.stats import pearsonr

from fedsim.messaging import ANY, Messenger, Policy, client_config
from fedsim.records import from_record, to_bytes, to_record
from fedsim.results import RunOutput, markdown_table
from fedsim.schema import Protocol, check
from fedsim.seeding import stream
from fedsim_clients import feddtre_messages as keys
from fedsim_experiments.common import RunContext, base_line, build_strategy, discover, innermost
from fedsim_tasks.causal_lm import load_policy, load_tokenizer, saved_sft_base, turn_separator
from fedsim_tasks.dialogue.dataset import (
    DialogueTask,
    answer_sample,
    contamination,
    examples,
    load_tasks,
    topical_chat,
    topical_chat_file,
)
from fedsim_tasks.dialogue.metrics import REPLY_METRICS, reply_scores
from fedsim_tasks.dialogue.trust_data import trust_examples
from fedsim_tasks.dp_sgd import DPSGD
from fedsim_tasks.hf import load_trainable, trainable_arrays

log = logging.getLogger("fedsim")
METRICS = REPLY_METRICS
SCORING = {"heldout", "trust"}  # where a FedDTRE client's trust scores come from (protocol.generator.scoring)
HELD_OUT_TRUST = stream("held-out-trust-data", "dataset")  # of the split seed: the evaluator's AUC pairs
TEST_CONTEXTS = stream("test-contexts", "dataset")  # of the split seed: the final evaluation's contexts
TEST_SAMPLING = stream("test-sampling", "dataset")  # of the run's seed: its replies (the same for every method)


@dataclass(frozen=True, kw_only=True)
class Generator:
    """The dialogue generator (``protocol.generator``)."""
    model: str                # causal LM; BERT names load as the warm-started decoder
    quantization: str | None  # null | 4bit (QLoRA, bitsandbytes NF4) | 8bit
    base_dir: str             # where the base SFT'd on Topical-Chat is saved once
    base_sft_steps: int       # full fine-tuning steps of the base on Topical-Chat valid
    base_sft_batch_size: int  # examples per base SFT step
    base_sft_lr: float        # AdamW learning rate of the base SFT
    base_seed: int | None     # base SFT seed (null: the run's); fixed: every run seed shares one base
    base_heldout: int         # Topical-Chat test_freq replies of the base's held-out loss
    lora: dict
    """the adapters every client trains (paper: r 8, alpha 16)"""
    max_length: int           # tokens of context + reply (the context is cut from the left)
    local_steps: int          # local optimizer steps per client and round (paper: 5)
    batch_size: int           # examples per step (paper: 16)
    lr: float                 # AdamW learning rate in the first round
    lr_final: float           # ... in the last round (linear in between)
    eval_contexts: int        # contexts a FedDTRE client scores each model on (paper: 100); >= 2
    scoring: str              # heldout: the client's held-out dialogues | trust: its trust data (paper's eq. 9)
    loss_gap_examples: int    # train and held-out replies of a mixing client's local-model nll gap (0: off)
    max_new_tokens: int       # reply length cap
    temperature: float        # sampling temperature (seeded)
    top_p: float              # nucleus sampling
    dp_sgd: DPSGD
    """record-level DP of the clients' local steps (DP-SGD through Opacus; ``fedsim_tasks/dp_sgd.py``)"""

    def gap_examples(self) -> int:
        """Replies of each side of a mixing client's loss gap: none under DP-SGD, whose guarantee
        the nll of the training replies, released as it is, would not cover."""
        return 0 if self.dp_sgd.enabled else self.loss_gap_examples


@dataclass(frozen=True, kw_only=True)
class EvaluatorTraining:
    """Federated training of the trust evaluator (``protocol.evaluator``)."""
    strategy: dict
    """its Flower strategy (the same for every method: the evaluator is their shared instrument)"""
    rounds: int             # FedAvg rounds
    clients_per_round: int  # clients sampled per round
    local_steps: int        # optimizer steps per client and round
    batch_size: int         # trust examples per step
    lr: float               # AdamW learning rate of adapters and calibration
    heldout_contexts: int   # held-out contexts per dataset (3 trust pairs each) of the AUC


@dataclass(frozen=True, kw_only=True)
class FedDTREProtocol(Protocol):
    """FedDTRE's protocol settings (``conf/experiment/feddtre_paper.yaml``)."""
    clients_per_round: int  # clients sampled per generator round (paper: 2)
    test_contexts: int      # held-out contexts per dataset of the final evaluation
    personal_contexts: int  # own held-out contexts per client of the personalized evaluation
    generator: Generator
    evaluator: EvaluatorTraining
    methods: dict[str, Any]
    """name -> {run: runner function, strategy: Flower strategy (federated runners)}, in run order"""

    def __post_init__(self):
        """Method names are components of dotted results paths and overrides, so they hold no
        dot; DP-SGD clips per-record gradients only: FedProx's proximal term would escape it."""
        dotted = [name for name in self.methods if "." in str(name)]
        if dotted:
            raise ValueError(f"protocol.methods: names {dotted} contain '.', which splits their results path "
                             f"(methods.<name>.<dataset>) and their overrides; write e.g. 0p5 for 0.5")
        g = self.generator
        if g.scoring not in SCORING:
            raise ValueError(f"protocol.generator.scoring={g.scoring!r}: one of {sorted(SCORING)}")
        for key, value, least in (("generator.eval_contexts", g.eval_contexts, 2),  # a standard error needs 2
                                  ("generator.local_steps", g.local_steps, 1),
                                  ("generator.loss_gap_examples", g.loss_gap_examples, 0),
                                  ("personal_contexts", self.personal_contexts, 1)):
            if value < least:
                raise ValueError(f"protocol.{key}={value}: at least {least}")
        if g.dp_sgd.enabled and g.scoring == "trust":
            raise ValueError("protocol.generator.scoring=trust scores replies to training contexts, which "
                             "protocol.generator.dp_sgd does not cover: score on heldout")
        proximal = [name for name, spec in self.methods.items()
                    if ((spec or {}).get("strategy") or {}).get("proximal_mu")]
        if self.generator.dp_sgd.enabled and proximal:
            raise ValueError(f"protocol.generator.dp_sgd with FedProx methods {proximal}: drop them "
                             f"(~protocol.methods.{proximal[0]})")

    def check_run(self, cfg: DictConfig, clients: int | None) -> None:
        """Flower would wait for nodes that never come: no round may sample more clients than
        the task has."""
        for key, per_round in (("clients_per_round", self.clients_per_round),
                               ("evaluator.clients_per_round", self.evaluator.clients_per_round)):
            if per_round > int(cfg.task.num_clients):
                raise ValueError(f"protocol.{key}={per_round} but the task has {cfg.task.num_clients} "
                                 "clients (task.num_clients)")
        if clients is not None:  # the population is known: the data was loaded, the contexts can be counted
            for split in (*BASE_TRAIN_SPLITS, BASE_HELDOUT_SPLIT):  # the base generator's corpus, read in the ServerApp
                topical_chat_file(str(cfg.data_root), split)
            task = OmegaConf.to_container(cfg.task, resolve=True)
            if why := self.context_shortfall(task, load_tasks(task, str(cfg.data_root))):
                raise ValueError(why)

    def scores_trust(self) -> bool:
        """Whether a method mixes by trust scores (a TrustAlpha strategy without a fixed alpha)."""
        return any(str(((spec or {}).get("strategy") or {}).get("_target_", "")).endswith(".TrustAlpha")
                   and ((spec or {}).get("strategy") or {}).get("fixed_alpha") is None
                   for spec in self.methods.values())

    def context_shortfall(self, task: dict, tasks: dict[str, DialogueTask]) -> str | None:
        """A client holding fewer contexts than a setting asks for would score or evaluate on
        fewer (silently, a smaller and noisier sample): which client, dataset and setting."""
        g, wanted = self.generator, [("personal_contexts", self.personal_contexts, "heldout")]
        if self.scores_trust():
            wanted.append(("generator.eval_contexts", g.eval_contexts, g.scoring))
        for name, d in tasks.items():
            for partition in range(int(task["num_clients"])):
                data = d.client(partition)
                held = {"heldout": len(d.examples(data.valid, " [SEP] ")),
                        "trust": min(int(task["trust"]["contexts_per_client"]), len(d.examples(data.train, " [SEP] ")))}
                for key, n, source in wanted:
                    if held[source] < n:
                        return (f"protocol.{key}={n} but client {partition} holds {held[source]} {source} contexts "
                                f"of {name} (raise task.valid_share / task.trust.contexts_per_client, or lower it)")
        return None

    def refuses_strategy(self, settings: dict) -> str | None:
        """The slot's methods (federated, naming no strategy) under DP-SGD: FedProx's term escapes it."""
        slot_methods = [name for name, spec in self.methods.items()
                        if spec and spec.get("run") == f"{__name__}.federated" and not spec.get("strategy")]
        if self.generator.dp_sgd.enabled and settings.get("proximal_mu") and slot_methods:
            return (f"protocol.generator.dp_sgd clips per-record gradients only, and the proximal term of "
                    f"methods {slot_methods} would escape it")
        return None


@dataclass
class Context(RunContext):
    """A FedDTRE runner's context: the shared one, the settings and the base adapters."""
    protocol: FedDTREProtocol
    tasks: dict[str, DialogueTask]
    base_path: str
    initial: dict                   # the adapters' initial weights (a zero LoRA update: the base)
    evaluator_blob: bytes = b""     # the trained evaluator's weights, sent with trust mixing

    def trust_examples(self, node: int) -> float:
        """The trust examples a client holds: 3 per sampled context of each dataset (the most
        weight its evaluator reply carries)."""
        contexts, info = int(self.cfg.task.trust.contexts_per_client), self.info[self.partition_of(node)]
        return float(sum(3 * min(contexts, info[keys.EXAMPLES_PREFIX + d]) for d in self.tasks))

    def generator_config(self, dataset: str, method: str) -> dict:
        g = self.protocol.generator
        settings = {**asdict(g), "base": self.base_path, "rounds": int(self.cfg.num_rounds)}
        return {**self.base, keys.OBJECTIVE: keys.GENERATOR, keys.DATASET: dataset,
                keys.LOCAL_MODEL: re.sub(r"[^A-Za-z0-9._-]", "_", f"generator-{dataset}-{method}"),
                keys.SETTINGS: json.dumps(settings), keys.LOCAL_STEPS: g.local_steps, keys.BATCH_SIZE: g.batch_size,
                keys.SEED: int(self.cfg.seed), keys.TORCH_THREADS: 1}


def base(ctx: Context, name: str, spec: DictConfig, dataset: str) -> dict:
    """No training: the base generator (its adapters are a zero update)."""
    return {"weights": ctx.initial}


def federated(ctx: Context, name: str, spec: DictConfig, dataset: str) -> dict:
    """The method's Flower strategy (``spec.strategy``) over ``clients_per_round`` clients per
    round; replies need finite weights (and, under mixing, an alpha in [0, 1])."""
    n = ctx.protocol.clients_per_round  # the fraction may round down; min_train_nodes restores n
    strategy = build_strategy(ctx.cfg, ctx.messenger, len(ctx.nodes), spec.get("strategy"),
                              fraction_train=n / len(ctx.nodes), fraction_evaluate=0.0, min_train_nodes=n,
                              min_available_nodes=n, weighted_by_key=keys.NUM_EXAMPLES, arrayrecord_key=keys.ARRAYS,
                              configrecord_key=keys.CONFIG)
    own = innermost(strategy)  # what the method's own strategy records (alphas), inside any privacy wrapper
    config = {**ctx.generator_config(dataset, name), keys.DP_ACCOUNT: f"{dataset}-{name}"}
    if getattr(own, "scores_trust", False):
        config[keys.EVALUATOR_WEIGHTS] = ctx.evaluator_blob
    initial = to_record(ctx.initial)
    scores = ctx.protocol.generator.eval_contexts if getattr(own, "scores_trust", False) else 0
    reply = keys.train_reply(initial, ctx.declared(keys.EXAMPLES_PREFIX + dataset),
                             ctx.cfg.protocol.strategy_slot.loss_key, mixing=hasattr(own, "alphas"), trust=scores,
                             loss_gap=ctx.protocol.generator.gap_examples() > 0)
    result = strategy.start(ctx.grid(f"{dataset}/{name}", Policy(ANY, reply)),
                            initial, int(ctx.cfg.num_rounds), ctx.cfg.round_timeout, ConfigRecord(config))
    out = {"weights": from_record(result.arrays), "strategy": _strategy_name(strategy),
           "rounds": {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}}
    if hasattr(own, "alphas"):  # by partition: node ids are random per run
        out["alphas"] = {r: [{"partition": ctx.partition_of(row.pop("node")), **row} for row in rows]
                         for r, rows in own.alphas.items()}
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
    config = ConfigRecord({**ctx.generator_config(dataset, name), keys.EVALUATOR_WEIGHTS: ctx.evaluator_blob,
                           keys.PERSONAL_CONTEXTS: ctx.protocol.personal_contexts,
                           keys.SERVER_ROUND: rounds + 1})  # the newest W_local is the last round's
    messages = [Message(RecordDict({keys.CONFIG: config, keys.ARRAYS: global_arrays}), dst_node_id=ctx.nodes[p],
                        message_type=MessageType.EVALUATE) for p in sorted(ctx.nodes)]
    replies = ctx.messenger.exchange(f"{dataset}/{name}/personal", messages,
                                     Policy(ANY, keys.personal_reply()), rounds + 1)
    return _personalized({ctx.partition_of(m.metadata.src_node_id): m.content[keys.METRICS] for m in replies})


def _personalized(metrics: dict[int, dict]) -> dict:
    """Per client (by partition): its personalized model's metrics, the global model's on the
    same contexts (``global_<metric>``) and the paired gain (``gain_<metric>``: personalized
    minus global); each number's mean, std (over clients, ddof 1), min and max."""
    rows = []
    for partition, m in sorted(metrics.items()):
        rows.append({"partition": partition, "kept_local": bool(m[keys.KEPT_LOCAL]), "contexts": int(m[keys.CONTEXTS]),
                     "distance_to_global": float(m[keys.DISTANCE]),
                     **{k: float(m[keys.PERSONAL + k]) for k in REPLY_METRICS},
                     **{f"global_{k}": float(m[keys.GLOBAL + k]) for k in REPLY_METRICS},
                     **{f"gain_{k}": float(m[keys.PERSONAL + k] - m[keys.GLOBAL + k]) for k in REPLY_METRICS}})
    numbers = [k for k in rows[0] if k not in ("partition", "kept_local", "contexts")]
    return {k: _spread([r[k] for r in rows]) for k in numbers} | {"clients": rows}


def _spread(values: list[float]) -> dict:
    """Mean, standard deviation (ddof 1; 0 for one value), min and max."""
    return {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
            "min": float(np.min(values)), "max": float(np.max(values))}


BASE_TRAIN_SPLITS, BASE_HELDOUT_SPLIT = ("valid_freq", "valid_rare"), "test_freq"  # Topical-Chat, the base's corpus


def base_generator(g: Generator, data_root: str, seed: int) -> tuple[str, dict]:
    """The generator's base, taught to answer on Topical-Chat (valid), its held-out loss on
    Topical-Chat test_freq: built once per settings and reused."""
    key = {k: getattr(g, k) for k in ("model", "base_sft_steps", "base_sft_batch_size", "base_sft_lr",
                                      "base_heldout", "max_length")} | {"seed": seed, "corpus": "topical_chat"}

    def data(sep: str):
        train = [e for split in BASE_TRAIN_SPLITS for e in examples(topical_chat(data_root, split), sep, 2, 0)]
        held_out = examples(topical_chat(data_root, BASE_HELDOUT_SPLIT), sep, 2, 0)[:g.base_heldout]
        return ([(e.prompt, e.reply) for e in train], [(e.prompt, e.reply) for e in held_out],
                {"data": "Topical-Chat valid_freq + valid_rare (every reply, 2 turns of context)",
                 "heldout": f"Topical-Chat test_freq, {len(held_out)} replies"})

    path, record = saved_sft_base(g.model, g.base_dir, key, data, steps=g.base_sft_steps,
                                  batch_size=g.base_sft_batch_size, lr=g.base_sft_lr, max_length=g.max_length,
                                  seed=seed)
    return str(path), record


def train_evaluator(ctx: Context, evaluator) -> dict:
    """AUC on held-out trust pairs of every dataset, federated fine-tuning (FedAvg), AUC again."""
    e, task = ctx.protocol.evaluator, ctx.cfg.task
    held_out = {name: trust_examples(d.examples(d.trust_heldout, " [SEP] "), e.heldout_contexts,
                                     HELD_OUT_TRUST.seed(task.split_seed, dataset=name), dict(task.trust.labels))
                for name, d in ctx.tasks.items()}
    held_out["all"] = [x for name in ctx.tasks for x in held_out[name]]
    before = {name: evaluator.auc(x) for name, x in held_out.items()}
    log.info("[feddtre] trust evaluator AUC before: %.3f; training %d rounds", before["all"]["auc"], e.rounds)
    start = time.perf_counter()
    config = {**ctx.base, keys.OBJECTIVE: keys.EVALUATOR, keys.LOCAL_STEPS: e.local_steps,
              keys.BATCH_SIZE: e.batch_size, keys.LR: e.lr, keys.SEED: int(ctx.cfg.seed), keys.TORCH_THREADS: 1}
    loss_key = ctx.cfg.protocol.strategy_slot.loss_key
    result = ctx.fedavg("evaluator", to_record(evaluator.weights()), e.rounds, config,
                        e.clients_per_round / len(ctx.nodes),
                        lambda sent: keys.train_reply(sent, ctx.trust_examples, loss_key), entry=e.strategy)
    evaluator.load(from_record(result.arrays))
    after = {name: evaluator.auc(x) for name, x in held_out.items()}
    log.info("[feddtre] trust evaluator AUC after: %.3f", after["all"]["auc"])
    return {"auc_before": before["all"]["auc"], "auc_after": after["all"]["auc"], "before": before, "after": after,
            "seconds": time.perf_counter() - start,
            "rounds": {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}}


def evaluate_generator(ctx: Context, weights: dict, dataset: str, evaluator, model, tokenizer) -> dict:
    """Replies to the dataset's held-out contexts (seeded sampling): BLEU, ROUGE, trust score."""
    g, d = ctx.protocol.generator, ctx.tasks[dataset]
    load_trainable(model, weights)
    chosen, replies = answer_sample(model, tokenizer, d.examples(d.test, turn_separator(tokenizer)),
                                    ctx.protocol.test_contexts,
                                    TEST_CONTEXTS.seed(ctx.cfg.task.split_seed, dataset=dataset),
                                    {"max_new_tokens": g.max_new_tokens, "temperature": g.temperature,
                                     "top_p": g.top_p}, TEST_SAMPLING.seed(ctx.cfg.seed, dataset=dataset))
    return {**reply_scores(replies, chosen, evaluator), "contexts": len(chosen),
            "example": {"context": chosen[0].prompt, "reply": replies[0], "true": chosen[0].reply}}


def context(messenger: Messenger, cfg: DictConfig, protocol: FedDTREProtocol, base_path: str, model) -> Context:
    """The runners' context: every client discovered, the task's datasets, the base generator at
    ``base_path`` and the initial weights of ``model``'s adapters (a function of its own, so that a
    test drives a runner with the messages a run sends)."""
    base_cfg = client_config(cfg)
    task = OmegaConf.to_container(cfg.task, resolve=True)
    tasks = load_tasks(task, task["data_root"])

    def holds(partition: int) -> dict[str, int]:
        """Each dataset's training examples the public partitioning gives ``partition``."""
        return {name: len(d.examples(d.client(partition).train, " [SEP] ")) for name, d in tasks.items()}
    reply = keys.discover_reply(messenger.partition_of, list(tasks), holds, int(cfg.task.num_clients))
    if why := protocol.context_shortfall(task, tasks):  # a run started without the CLI's checks
        raise ValueError(why)
    nodes, info = discover(messenger, base_cfg, reply)
    return Context(messenger, cfg, base_cfg, nodes, {p: dict(i) for p, i in info.items()}, protocol,
                   tasks, base_path, trainable_arrays(model))


def run(messenger: Messenger, cfg: DictConfig, out: RunOutput) -> tuple[dict, str]:
    protocol = check(cfg)  # the protocol block as its typed dataclass
    task = OmegaConf.to_container(cfg.task, resolve=True)
    g = protocol.generator
    start = time.perf_counter()
    base_seed = int(cfg.seed if g.base_seed is None else g.base_seed)
    base_path, base_record = base_generator(g, task["data_root"], base_seed)
    model = load_policy(base_path, dict(g.lora), int(cfg.task.seed), g.quantization)
    tokenizer = load_tokenizer(base_path)
    base_seconds = time.perf_counter() - start
    ctx = context(messenger, cfg, protocol, base_path, model)
    results = {"clients": {str(p): dict(i) for p, i in sorted(ctx.info.items())},
               "data": {name: {"train": f"{d.spec['train_split']} split ({len(d.train)} conversations)",
                               "evaluation": f"{d.spec['eval_split']} split: {len(d.trust_heldout)} conversations "
                                             f"for trust pairs, {len(d.test)} for generation contexts"}
                        for name, d in ctx.tasks.items()},
               "base": {"path": base_path, "sft": base_record, "seconds": base_seconds}}
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
            scores = evaluate_generator(ctx, trained["weights"], dataset, evaluator, model, tokenizer)
            personal = {"personalized": trained["personalized"]} if "personalized" in trained else {}
            ran = {"strategy": trained["strategy"]} if "strategy" in trained else {}
            results["methods"].setdefault(name, {})[dataset] = {**scores, **personal, **ran,
                                                                "seconds": time.perf_counter() - start}
            results["rounds"].setdefault(name, {})[dataset] = trained.get("rounds", {})
            if "alphas" in trained:
                results["alpha"].setdefault(name, {})[dataset] = _alpha_rows(trained["alphas"])
                results.setdefault("alpha_gap", {}).setdefault(name, {})[dataset] = alpha_vs_gap(trained["alphas"])
            if contaminated and personal:
                results["contamination"]["methods"].setdefault(name, {})[dataset] = _contamination(
                    trained, contaminated)
            results["communication"].setdefault(name, {})[dataset] = _communication(messenger, f"{dataset}/{name}")
            log.info("[feddtre] %s / %s: BLEU-1 %.2f ROUGE-1 %.2f trust %.3f (%.0f s)", dataset, name,
                     scores["bleu1"], scores["rouge1"], scores["trust_bertscore"], time.perf_counter() - start)
    return results, _summary(results, out)


def _alpha_rows(alphas: dict[int, list[dict]]) -> dict:
    """Per round: every client's alpha (and trust scores), their mean, std, min and max."""
    return {str(rnd): {**_spread([r[keys.ALPHA] for r in rows]), "clients": rows}
            for rnd, rows in sorted(alphas.items())}


def alpha_vs_gap(alphas: dict[int, list[dict]]) -> dict:
    """Does a client's alpha follow its overfitting? Over every client-round: the correlation of
    alpha with the local model's held-out minus train nll (Pearson's r, its 95% CI by Fisher's z:
    scipy.stats.pearsonr; client-rounds of one client are not independent, so the CI is a lower
    bound on the uncertainty), and whether s_g - s_l stood above its own noise (its mean, the mean
    standard error over the scoring contexts, the share of client-rounds beyond 2 standard errors).
    Empty where the clients measured no gap; no r where alpha or the gap does not vary."""
    rows = [r for rs in alphas.values() for r in rs]
    out: dict[str, Any] = {"client_rounds": len(rows)}
    if rows and all(keys.S_GAP_SE in r for r in rows):
        gaps = np.array([r[keys.S_GLOBAL] - r[keys.S_LOCAL] for r in rows])
        se = np.array([r[keys.S_GAP_SE] for r in rows])
        out |= {"s_gap_mean": float(gaps.mean()), "s_gap_se_mean": float(se.mean()),
                "share_beyond_2se": float(np.mean(np.abs(gaps) > 2 * se))}
    if not rows or not all(keys.TRAIN_NLL in r for r in rows):
        return out
    alpha = np.array([r[keys.ALPHA] for r in rows])
    gap = np.array([r[keys.HELDOUT_NLL] - r[keys.TRAIN_NLL] for r in rows])
    out |= {"loss_gap_mean": float(gap.mean()), "alpha_mean": float(alpha.mean())}
    if len(rows) >= 3 and np.ptp(alpha) > 0 and np.ptp(gap) > 0:
        test = pearsonr(alpha, gap)
        ci = test.confidence_interval(0.95)
        out |= {"pearson_r": float(test.statistic), "ci": [float(ci.low), float(ci.high)], "p": float(test.pvalue)}
    return out


def _contamination(trained: dict, contaminated: frozenset[int]) -> dict:
    """The contaminated clients beside the clean ones: mean alpha, s_l and s_g over their
    client-rounds (mixing methods), and their personalized models' mean trust score and PII
    rate (every method)."""
    rounds = [row for rows in trained.get("alphas", {}).values() for row in rows]
    clients = trained["personalized"]["clients"]
    out = {}
    for group, members in (("contaminated", lambda p: p in contaminated), ("clean", lambda p: p not in contaminated)):
        mine = [r for r in rounds if members(r["partition"])]
        personal = [c for c in clients if members(c["partition"])]
        out[group] = {"client_rounds": len(mine), "clients": len(personal),
                      **{k.replace("-", "_"): float(np.mean([r[k] for r in mine]))
                         for k in (keys.ALPHA, keys.S_LOCAL, keys.S_GLOBAL) if mine and all(k in r for r in mine)},
                      **{f"personal_{k}": float(np.mean([c[k] for c in personal]))
                         for k in ("trust_bertscore", "pii_rate") if personal}}
    return out


def _communication(messenger: Messenger, phase: str) -> dict:
    rows = list(messenger.traffic.get(f"{phase}/train", {}).values())
    if not rows:
        return {"bytes_per_round": 0.0, "rounds": 0}
    return {"bytes_per_round": float(np.mean([r["bytes_down"] + r["bytes_up"] for r in rows])),
            "bytes_down_per_round": float(np.mean([r["bytes_down"] for r in rows])),
            "bytes_up_per_round": float(np.mean([r["bytes_up"] for r in rows])), "rounds": len(rows)}


def _summary(r: dict, out: RunOutput) -> str:
    ev = r["evaluator"]
    text = (f"# FedDTRE on {', '.join(r['data'])}\n\n"
            f"Trust evaluator AUC on held-out trust pairs: {ev['auc_before']:.3f} before, "
            f"{ev['auc_after']:.3f} after federated fine-tuning.\n"
            + base_line(r["base"]["sft"]).replace("Base:", "Base generator:", 1) + "\n")
    for dataset in r["data"]:
        rows = [{"method": m, "strategy": v[dataset].get("strategy", ""), **{k: v[dataset][k] for k in METRICS},
                 "MB/round": r["communication"][m][dataset]["bytes_per_round"] / 1e6}
                for m, v in r["methods"].items()]
        text += (f"\n## {dataset} ({r['data'][dataset]['evaluation']})\n"
                 + markdown_table(rows, ["method", "strategy", *METRICS, "MB/round"], digits=3) + "\n"
                 + _personalized_table(r, dataset) + _alpha_gap_table(r, dataset) + _contamination_table(r, dataset))
    _plot_alpha(r, out)
    _plot_alpha_gap(r, out)
    return text


def _personalized_table(r: dict, dataset: str) -> str:
    """Each federated method's personalized models on the clients' own held-out contexts (mean
    ± std over clients), the paired trust gain over the global model, the distance to it."""
    rows = []
    for m, v in r["methods"].items():
        p = v[dataset].get("personalized")
        if p:
            rows.append({"method": m, "clients": len(p["clients"]),
                         "own W_local": sum(c["kept_local"] for c in p["clients"]),
                         **{k: f"{p[k]['mean']:.3f} ± {p[k]['std']:.3f}"
                            for k in (*METRICS, "gain_trust_bertscore", "distance_to_global")}})
    if not rows:
        return ""
    return (f"\n### {dataset}: personalized models on each client's own held-out contexts (mean ± std over "
            f"clients; gain: personalized minus global on the same contexts)\n"
            + markdown_table(rows, ["method", "clients", "own W_local", *METRICS, "gain_trust_bertscore",
                                    "distance_to_global"]) + "\n")


def _alpha_gap_table(r: dict, dataset: str) -> str:
    """Each mixing method's s_g - s_l against its noise and alpha against the overfitting gap."""
    columns = ["client_rounds", "s_gap_mean", "s_gap_se_mean", "share_beyond_2se", "alpha_mean", "loss_gap_mean",
               "pearson_r", "ci", "p"]
    rows = [{"method": m, **{k: v[dataset][k] for k in columns if k in v[dataset]}}
            for m, v in r.get("alpha_gap", {}).items() if dataset in v]
    if not rows:
        return ""
    for row in rows:
        row["ci"] = "[{:.3f}, {:.3f}]".format(*row["ci"]) if "ci" in row else ""
    return (f"\n### {dataset}: alpha against the local model's overfitting (held-out minus train nll per token), "
            f"over client-rounds; s_g - s_l against its standard error over the scoring contexts\n"
            + markdown_table(rows, ["method", *columns], digits=3) + "\n")


def _contamination_table(r: dict, dataset: str) -> str:
    """The contaminated clients beside the clean ones, per method (``task.contamination``)."""
    c = r.get("contamination")
    if not c:
        return ""
    columns = ["alpha", "s_local", "s_global", "personal_trust_bertscore", "personal_pii_rate"]
    rows = [{"method": m, **{f"{k} ({g})": v[dataset][g][k] for k in columns for g in ("contaminated", "clean")
                             if k in v[dataset][g]}}
            for m, v in c["methods"].items() if dataset in v]
    return (f"\n### {dataset}: contaminated clients {c['clients']} (share {c['share']} of their training replies "
            f"with planted PII) against the clean ones\n"
            + markdown_table(rows, ["method", *(f"{k} ({g})" for k in columns for g in ("contaminated", "clean"))],
                             digits=3) + "\n")


def _plot_alpha(r: dict, out: RunOutput) -> None:
    fig, ax, save = out.figure("alpha_per_round")
    for name, by_dataset in r["alpha"].items():
        for dataset, rounds in by_dataset.items():
            x = [int(k) for k in rounds]
            mean = [v["mean"] for v in rounds.values()]
            line, = ax.plot(x, mean, marker="o", label=f"{name} / {dataset}")
            ax.fill_between(x, [v["min"] for v in rounds.values()], [v["max"] for v in rounds.values()],
                            color=line.get_color(), alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel("alpha (mean, min-max over clients)")
    ax.set_title("FedDTRE: weight of the global model in each client's mix")
    ax.legend(fontsize=7)
    save()


def _plot_alpha_gap(r: dict, out: RunOutput) -> None:
    """Every client-round's alpha against its local model's overfitting gap, per mixing method."""
    points = {(m, d): [(row[keys.HELDOUT_NLL] - row[keys.TRAIN_NLL], row[keys.ALPHA])
                       for rnd in rounds.values() for row in rnd["clients"] if keys.TRAIN_NLL in row]
              for m, by_dataset in r["alpha"].items() for d, rounds in by_dataset.items()}
    if not any(points.values()):
        return
    fig, ax, save = out.figure("alpha_vs_gap")
    for (m, d), xy in points.items():
        if xy:
            stats = r["alpha_gap"][m][d]
            label = f"{m} / {d}" + (f" (r {stats['pearson_r']:+.2f})" if "pearson_r" in stats else "")
            ax.scatter(*zip(*xy), s=12, alpha=0.7, label=label)
    ax.set_xlabel("local model: held-out minus train nll per token")
    ax.set_ylabel("alpha")
    ax.set_title("FedDTRE: alpha against each client's overfitting, per client-round")
    ax.legend(fontsize=7)
    save()
