"""FedE4RAG's experiment protocol (METHODS.md section 3), run inside the ServerApp.

Every method gets the same budget of optimizer steps, counted over all clients:
``num_rounds * local_steps * clients``. The vanilla model trains nothing; a client alone and
the centralized baseline (one node pooling every client's documents: the non-private oracle)
spend the whole budget on one node; the federated methods spend ``local_steps`` per client and
round. Evaluation runs on one node (``evaluator_partition``), because under HE only clients
ever hold the global model; the server receives metrics only.

A federated method with ``local_models`` is FedE4RAG's dual training: every company keeps its
own retriever across rounds (on its own disk), trains it with the received global model as
KD-GLE's frozen teacher and sends it; the server averages what it receives into the global
model. Each company's local retriever is evaluated on its own node beside the global model
(``local`` in the results: mean and spread over companies); for a method without local models a
company's model is the global one.

Each method is a function named by ``run`` in ``protocol.methods`` (no dispatcher here). This
module reads top down: the run, one method's training and evaluation, the runners, the
evaluation, then the plumbing (context, messages). Settings: ``settings.py``; tables and
plots: ``report.py``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig

from fedsim.privacy.he import messages as he_keys
from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import RunOutput
from fedsim.runtime.messaging import ANY, Messenger, PhaseFailed, Policy, client_config
from fedsim.runtime.records import from_record
from fedsim.runtime.validators import Validator
from fedsim_clients import fede4rag_messages as keys
from fedsim_experiments.common import RunContext, build_strategy, discover
from fedsim_experiments.fede4rag import report
from fedsim_experiments.fede4rag.settings import scored, splits
from fedsim_strategies.client_spread import ClientSpread, model_spread
from fedsim_strategies.lora_product import LoraProductAvg
from fedsim_strategies.round_config import RoundConfig
from fedsim_tasks.financebench_rag.dataset import client_documents
from fedsim_tasks.financebench_rag.retrieval import METRICS, weights_key

log = logging.getLogger("fedsim")


def run(
    messenger: Messenger, cfg: DictConfig, out: RunOutput, plan: PrivacyPlan
) -> tuple[dict, str]:
    ctx = context(messenger, cfg, plan)
    info, budget = ctx.info, ctx.budget
    log.info(
        "[fede4rag] %d clients %s; budget %d optimizer steps per method",
        len(ctx.nodes),
        {
            partition_id: (i[keys.COMPANIES], i[keys.NUM_PAIRS])
            for partition_id, i in sorted(info.items())
        },
        budget,
    )
    results = {
        "clients": {str(k): v for k, v in sorted(info.items())},
        "budget_steps": budget,
        "methods": {},
        "round_cost": {},
    }
    for name, spec in cfg.protocol.methods.items():
        if spec is not None:  # an experiment leaves a method out by setting it to null
            results["methods"][name] = train_and_evaluate(ctx, name, spec)
    for (
        name,
        rounds,
    ) in ctx.cost.items():  # per method: compare HE with the plaintext run of equal KD
        results["round_cost"][name] = report.cost_summary(rounds)
    return results, report.summary(results, out)


def train_and_evaluate(ctx: Context, name: str, spec: DictConfig) -> dict:
    """One method: its runner (``spec.run``), then the evaluation of what it produced."""
    start = time.perf_counter()
    trained = get_method(spec.run)(ctx, name, spec)
    train_s = time.perf_counter() - start
    scores = _evaluate(ctx, name, trained) if trained.source else {}  # local_only: no global model
    if trained.local or spec.run.endswith(".federated"):
        scores["local"] = _evaluate_local(ctx, name, trained, scores)
    log.info(
        "[fede4rag] %s: %s (%.0f s)",
        name,
        ", ".join(
            f"{s} ndcg@10 {scores[s]['ndcg@10']:.4f}" for s in scored(ctx.cfg) if s in scores
        ),
        time.perf_counter() - start,
    )
    ctx.finished[name] = {
        **scores,
        "train_seconds": train_s,
        "eval_seconds": time.perf_counter() - start - train_s,
        **trained.details,
    }
    return ctx.finished[name]


def context(messenger: Messenger, cfg: DictConfig, plan: PrivacyPlan) -> Context:
    """The runners' context: every client discovered, the step budget (a function of its own, so
    that a test drives a runner with the messages a run sends)."""
    base = client_config(cfg)
    nodes, info = _discover(messenger, base, cfg)
    return Context(
        messenger,
        cfg,
        base,
        nodes,
        info,
        int(cfg.num_rounds * cfg.protocol.local_steps * len(nodes)),
        plan=plan,
    )


@dataclass
class Trained:
    """What a runner produced: the weights to evaluate and what to report."""

    source: str | None  # keys.FROM_INITIAL | FROM_ARRAYS | FROM_HE; None: no global model
    details: dict
    arrays: ArrayRecord | None = None  # FROM_ARRAYS: the model the server holds
    he_round: int = 0  # FROM_HE: the round of the clients' aggregate
    local: str | None = None  # the name each company keeps its own retriever under


def vanilla(ctx: Context, name: str, spec: DictConfig) -> Trained:
    return Trained(keys.FROM_INITIAL, {"steps": 0})


def alone(ctx: Context, name: str, spec: DictConfig) -> Trained:
    """One client trains on its own pairs for the whole budget (largest or smallest client)."""
    sizes = {partition_id: info[keys.NUM_PAIRS] for partition_id, info in ctx.info.items()}
    pick = max(sizes, key=sizes.get) if spec.which == "largest" else min(sizes, key=sizes.get)
    config = ctx.train_config(name, keys.FROM_INITIAL, 0.0, ctx.budget, _threads(ctx.cfg, 1))
    reply = ctx.ask(
        ctx.nodes[pick],
        MessageType.TRAIN,
        config,
        f"{name}/train",
        keys.train_reply(None, ctx.pairs, None),
        rounds_of_work=ctx.budget_rounds,
    )
    return Trained(
        keys.FROM_ARRAYS,
        {
            "steps": ctx.budget,
            "partition": pick,
            "pairs": sizes[pick],
            "companies": ctx.info[pick][keys.COMPANIES],
        },
        reply[keys.ARRAYS],
    )


def centralized(ctx: Context, name: str, spec: DictConfig) -> Trained:
    """The union of every client's pairs on one node: the non-private upper reference."""
    config = {
        **ctx.train_config(name, keys.FROM_INITIAL, 0.0, ctx.budget, _threads(ctx.cfg, 1)),
        keys.POOL_PARTITIONS: sorted(ctx.nodes),
    }
    pooled = sum(i[keys.NUM_PAIRS] for i in ctx.info.values())
    reply = ctx.ask(
        ctx.evaluator,
        MessageType.TRAIN,
        config,
        f"{name}/train",
        keys.train_reply(None, pooled, None),
        rounds_of_work=ctx.budget_rounds,
    )
    return Trained(
        keys.FROM_ARRAYS,
        {"steps": ctx.budget, "pairs": int(reply[keys.METRICS][keys.NUM_EXAMPLES])},
        reply[keys.ARRAYS],
    )


def federated(ctx: Context, name: str, spec: DictConfig) -> Trained:
    """The slot's strategy (``strategy`` in ``privacy``'s wrapper) for ``num_rounds`` (quorum per
    round: any client); with ``he`` wrapped in HEFedAvg (``one_trip``, default true: an update
    that fits one message travels encrypted in the train reply; false: always the chunk phases).
    ``lora_aggregation: product`` averages the LoRA adapters' products (``LoraProductAvg``)
    instead of each factor apart. In plaintext the rounds' metrics include how far apart the
    client models are and how far each moved from the global model it received (``ClientSpread``:
    ``client-distance``, ``update-norm``; with ``local_models`` the latter is the company's own
    retriever's distance to the global model)."""
    rounds, threads = int(ctx.cfg.num_rounds), _threads(ctx.cfg, len(ctx.nodes))
    he = {
        "chunk_floats": ctx.cfg.protocol.he_chunk_floats,
        "one_trip": bool(spec.get("one_trip", True)),
    }
    strategy = build_strategy(ctx.cfg, ctx.plan, len(ctx.nodes), he=he if spec.he else None)
    if spec.get("lora_aggregation", "factors") == "product":  # plaintext only: settings.py checks
        strategy = LoraProductAvg(strategy)
    local = f"retriever-{name}" if spec.get("local_models", False) else None
    if spec.he or ctx.plan.he:
        config = ConfigRecord(
            ctx.train_config(
                name, keys.FROM_HE, spec.kd_weight, ctx.cfg.protocol.local_steps, threads, local
            )
        )
        grid = ctx.grid(name).checked(MessageType.TRAIN, keys.he_train_weight(ctx.pairs))
        result = strategy.start(grid, ArrayRecord(), rounds, ctx.cfg.round_timeout, config)
        ctx.cost[name] = list(strategy.rounds.values())
        return Trained(
            keys.FROM_HE,
            {"steps": ctx.budget, "rounds": _round_metrics(result)},
            he_round=rounds,
            local=local,
        )
    config = ConfigRecord(
        ctx.train_config(
            name, keys.FROM_ARRAYS, spec.kd_weight, ctx.cfg.protocol.local_steps, threads, local
        )
    )
    schedule = matched_lr(ctx, spec.get("match_update_norm"))
    every_round = _every_round(ctx, name) if ctx.cfg.protocol.eval_every_round else None
    start = time.perf_counter()
    reply = keys.train_reply(_initial(ctx), ctx.pairs, ctx.cfg.protocol.strategy_slot.loss_key)
    result = RoundConfig(ClientSpread(strategy), schedule).start(
        ctx.grid(name, Policy(ANY, reply)),
        _initial(ctx),
        rounds,
        ctx.cfg.round_timeout,
        config,
        evaluate_fn=every_round,
    )
    seconds = (time.perf_counter() - start) / rounds
    traffic = [ctx.messenger.round_traffic(f"{name}/train", r) for r in range(1, rounds + 1)]
    ctx.cost[name] = [
        {"round-seconds": seconds, "bytes-up-per-client": t["bytes_up"] / t["messages"]}
        for t in traffic
    ]
    details = {"steps": ctx.budget, "rounds": _round_metrics(result)}
    if schedule:
        details["lr_by_round"] = {r: v[keys.LR] for r, v in schedule.items()}
    if every_round:
        details["by_round"] = {
            r: _nested(m) for r, m in sorted(result.evaluate_metrics_serverapp.items())
        }
    return Trained(keys.FROM_ARRAYS, details, result.arrays, local=local)


def matched_lr(ctx: Context, match: DictConfig | None) -> dict[int, dict]:
    """The anchoring control's learning rate per round (``match_update_norm: {method,
    reference}``): ``protocol.lr`` times ``method``'s per-round ``delta-update-norm`` over
    ``reference``'s, both run before it in this run, ``reference`` being this method at
    ``protocol.lr`` (FedAvg). AdamW moves each weight by about ``lr`` per step whatever the
    gradient's size, so over the same steps the update, and to first order what the LoRA pairs
    add (``B @ A``), scales with ``lr``: the control then moves each round as far from the global
    model it received as ``method``'s clients did, with no KD. What it reached is in its own
    ``rounds`` (``delta-update-norm``) beside ``lr_by_round``. No match: no schedule ({})."""
    if not match:
        return {}
    target, reference = (ctx.finished[match[k]]["rounds"] for k in ("method", "reference"))
    lr = float(ctx.cfg.protocol.lr)
    return {
        r: {keys.LR: lr * target[r]["delta-update-norm"] / reference[r]["delta-update-norm"]}
        for r in sorted(target)
    }


def _every_round(ctx: Context, name: str) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    """Flower's server-side ``evaluate_fn``: after each round the global model is evaluated as
    the method's final one is (on the evaluator, every split), ``<split>/<metric>`` flat; not
    before the first (that is ``vanilla``). The last round's corpus encoding is the final
    evaluation's (the embedding store is keyed by the weights)."""

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            return None
        scores = _evaluate(
            ctx, f"{name}/round-{server_round}", Trained(keys.FROM_ARRAYS, {}, arrays)
        )
        return MetricRecord(
            {f"{split}/{m}": scores[split][m] for split in scored(ctx.cfg) for m in METRICS}
        )

    return evaluate


def _nested(metrics) -> dict:
    """``<split>/<metric>`` flat metrics as ``{split: {metric: value}}``."""
    out: dict = {}
    for key, value in metrics.items():
        split, _, metric = key.rpartition("/")
        out.setdefault(split, {})[metric] = float(value)
    return out


def local_only(ctx: Context, name: str, spec: DictConfig) -> Trained:
    """Every company trains its own retriever alone, never averaged: ``num_rounds`` train messages
    of ``local_steps`` each from the common initial model, kept across them on its own disk, as
    a federated method's client trains with ``local_models`` (a round's seed is the same). The
    method has no global model; each round records how far apart the companies' retrievers are
    and how far they moved from the initial model (``client_spread.model_spread``)."""
    rounds, local = int(ctx.cfg.num_rounds), f"retriever-{name}"
    config = ctx.train_config(
        name,
        keys.FROM_INITIAL,
        0.0,
        ctx.cfg.protocol.local_steps,
        _threads(ctx.cfg, len(ctx.nodes)),
        local,
    )
    start = from_record(_initial(ctx))
    per_round = {}
    for rnd in range(1, rounds + 1):
        replies = ctx.ask_each(
            {node: {**config, keys.SERVER_ROUND: rnd} for node in ctx.nodes.values()},
            MessageType.TRAIN,
            f"{name}/train",
            keys.train_reply(_initial(ctx), ctx.pairs, None),
            server_round=rnd,
        )
        metrics = [r[keys.METRICS] for r in replies]
        pairs = [float(m[keys.NUM_EXAMPLES]) for m in metrics]
        per_round[rnd] = {
            k: float(np.average([m[k] for m in metrics], weights=pairs))
            for k in metrics[0]
            if k != keys.NUM_EXAMPLES
        } | model_spread([from_record(r[keys.ARRAYS]) for r in replies], pairs, start)
        log.info(
            "[fede4rag] %s round %d/%d: client-distance %.4g, update-norm (from the initial model) %.4g",
            name,
            rnd,
            rounds,
            per_round[rnd]["client-distance"],
            per_round[rnd]["update-norm"],
        )
    return Trained(None, {"steps": ctx.budget, "rounds": per_round}, local=local)


def _initial(ctx: Context) -> ArrayRecord:
    """The clients' common initial weights, asked once of the evaluator, so round 1 sends a
    real model like every other round."""
    if ctx.initial is None:
        config = {**ctx.base, keys.QUERY_OP: keys.INITIAL_WEIGHTS}
        ctx.initial = ctx.ask(
            ctx.evaluator, MessageType.QUERY, config, "initial-weights", keys.weights_reply()
        )[keys.ARRAYS]
    return ctx.initial


def _round_metrics(result) -> dict:
    return {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}


def _encode_corpus(
    ctx: Context, name: str, trained: Trained, config: dict, encoders: list[int]
) -> None:
    """Encode the corpus one bounded piece per message (each reply's work is capped by
    ``eval_pages_per_message``, so ``round_timeout`` holds on a busy machine), on the
    ``encoders`` side by side: each wave gives each encoder one missing piece. A piece is
    missing after a wave only if every encoder saw it missing after its own; one the wave asked
    for is encoded by then, else the encoding stops here (it would never end)."""
    start = time.perf_counter()
    config = {
        **config,
        keys.EVAL_OP: keys.ENCODE,
        keys.TORCH_THREADS: _threads(ctx.cfg, len(encoders)),
    }
    todo, wave = list(range(len(encoders))), 0  # the number of pieces is known after wave 1
    pages = int(ctx.cfg.protocol.eval_pages_per_message)
    while todo:
        wave += 1
        asked = dict(zip(encoders, todo))
        replies = ctx.ask_each(
            {node: {**config, keys.PIECE: i} for node, i in asked.items()},
            MessageType.EVALUATE,
            f"eval/{name}/encode",
            keys.encode_reply(pages),
            None if config[keys.WEIGHTS] == keys.FROM_LOCAL else trained.arrays,
            server_round=wave,
        )
        pieces = int(replies[0][keys.METRICS][keys.PIECES])
        todo = sorted(set.intersection(*(set(r[keys.METRICS][keys.MISSING]) for r in replies)))
        log.info(
            "[eval %s] corpus pieces %d/%d encoded on %d node(s), %.0f s",
            name,
            pieces - len(todo),
            pieces,
            len(encoders),
            time.perf_counter() - start,
        )
        if set(todo) & set(asked.values()):
            raise PhaseFailed(
                f"eval {name}: corpus encoding makes no progress ({len(todo)} pieces left, "
                f"those of wave {wave} among them)"
            )


def _evaluate(ctx: Context, name: str, trained: Trained, node: int | None = None) -> dict:
    """Encode the corpus, then score on the evaluator (``node``: that node alone, on its own
    local retriever). The weights the client evaluated must be the ones the method produced
    (the server can check it where it holds them)."""
    own = node is not None
    source = keys.FROM_LOCAL if own else trained.source
    config = {
        **ctx.base,
        keys.METHOD: name,
        keys.WEIGHTS: source,
        keys.SPLITS: splits(ctx.cfg),
        **(
            {he_keys.GLOBAL_ROUND: trained.he_round} if source == keys.FROM_HE else {}
        ),  # the HE layer's
        keys.PER_FILING: bool(ctx.cfg.protocol.eval_per_filing),
        keys.PER_CLIENT: bool(ctx.cfg.protocol.eval_per_client),
        keys.TORCH_THREADS: _threads(ctx.cfg, 1),
        keys.PAGES_PER_MESSAGE: int(ctx.cfg.protocol.eval_pages_per_message),
        keys.EVAL_BACKEND: str(ctx.cfg.protocol.eval_backend),
        **({keys.LOCAL_MODEL: trained.local} if own else {}),
    }
    label, arrays = (f"{name}/local", None) if own else (name, trained.arrays)
    _encode_corpus(ctx, label, trained, config, [node] if own else ctx.encoders)
    task = ctx.cfg.task
    expected = (
        None
        if own or trained.source == keys.FROM_HE
        else weights_key(
            task.model, task.lora, None if trained.arrays is None else from_record(trained.arrays)
        )
    )
    reply = ctx.ask(
        node if own else ctx.evaluator,
        MessageType.EVALUATE,
        {**config, keys.EVAL_OP: keys.SCORE},
        f"eval/{label}/score",
        keys.score_reply(scored(ctx.cfg), METRICS, expected, _client_labels(ctx)),
        arrays,
    )
    evaluated = reply[keys.WEIGHTS_INFO][keys.WEIGHTS_KEY]
    metrics = reply[keys.METRICS]
    by_client = {
        c: _label_scores(metrics, c) for c in _client_labels(ctx) if f"{c}/questions" in metrics
    }
    return (
        {"weights_key": evaluated}
        | {split: _label_scores(metrics, split) for split in scored(ctx.cfg)}
        | ({"by_client": by_client} if ctx.cfg.protocol.eval_per_client else {})
    )


def _label_scores(metrics, label: str) -> dict:
    return (
        {m: float(metrics[f"{label}/{m}"]) for m in METRICS}
        | {
            "questions": int(metrics[f"{label}/questions"]),
            "corpus_pages": int(metrics[f"{label}/corpus-pages"]),
        }
        | (
            {"corpus_entries": int(metrics[f"{label}/corpus-entries"])}
            if f"{label}/corpus-entries" in metrics
            else {}
        )
    )


def _client_labels(ctx: Context) -> list[str]:
    """The labels of each client's questions within its own filings (``eval_per_client``)."""
    return (
        [f"{s}-client{p}" for s in splits(ctx.cfg) for p in sorted(ctx.nodes)]
        if ctx.cfg.protocol.eval_per_client
        else []
    )


def _evaluate_local(ctx: Context, name: str, trained: Trained, global_scores: dict) -> dict:
    """Each company's own retriever on its own node (one after the other, each with every
    thread), or the global model's scores for each company where the method keeps no local
    model: ``<split>.<metric>`` the mean over companies, ``spread`` its std / min / max,
    ``clients`` every company's scores; with ``eval_per_client``, ``per_client`` (see
    :func:`_per_client`)."""
    clients, own = {}, bool(trained.local and ctx.cfg.protocol.eval_local)
    for partition_id, node in sorted(ctx.nodes.items()):
        clients[str(partition_id)] = (
            _evaluate(ctx, name, trained, node)
            if own
            else {
                k: global_scores[k] for k in [*scored(ctx.cfg), "by_client"] if k in global_scores
            }
        )
    out = {"model": "own" if own else "global", "clients": clients, "spread": {}}
    if ctx.cfg.protocol.eval_per_client:
        out["per_client"] = _per_client(ctx, clients, global_scores.get("by_client"))
    for split in scored(ctx.cfg):
        values = {m: np.array([c[split][m] for c in clients.values()]) for m in METRICS}
        out[split] = {m: float(v.mean()) for m, v in values.items()}
        out["spread"][split] = {
            m: {
                "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                "min": float(v.min()),
                "max": float(v.max()),
            }
            for m, v in values.items()
        }
    if own:
        log.info(
            "[fede4rag] %s local retrievers: %s",
            name,
            ", ".join(
                f"{s} ndcg@10 {out[s]['ndcg@10']:.4f} (min {out['spread'][s]['ndcg@10']['min']:.4f})"
                for s in scored(ctx.cfg)
            ),
        )
    return out


def _per_client(ctx: Context, clients: dict, global_by_client: dict | None) -> dict:
    """Per split and metric, for each client that owns questions: ``own`` its retriever on its
    own questions within its own filings (localized RAG), ``others`` its retriever on the other
    clients' questions, each within its owner's filings (the mean over them: what it forgot or
    never learned), ``global`` the global model on its questions (absent without a global
    model); ``mean`` each over the clients."""
    out = {}
    for split in splits(ctx.cfg):
        owners = [p for p in clients if f"{split}-client{p}" in clients[p]["by_client"]]
        out[split] = {}
        for m in METRICS:
            row = {
                "own": {p: _on(clients[p]["by_client"], split, p, m) for p in owners},
                "others": {
                    p: float(
                        np.mean(
                            [_on(clients[p]["by_client"], split, q, m) for q in owners if q != p]
                        )
                    )
                    for p in owners
                    if len(owners) > 1
                },
            }
            if global_by_client is not None:
                row["global"] = {p: _on(global_by_client, split, p, m) for p in owners}
            row["mean"] = {k: float(np.mean(list(v.values()))) for k, v in row.items() if v}
            out[split][m] = row
    return out


def _on(by_client: dict, split: str, client: str, metric: str) -> float:
    """A model's score on one client's questions (``by_client`` of its evaluation)."""
    return by_client[f"{split}-client{client}"][metric]


def _discover(
    messenger: Messenger, base: dict, cfg: DictConfig | None = None
) -> tuple[dict[int, int], dict[int, dict]]:
    """Every company's node; where ``cfg`` is given, each must hold exactly the documents the
    public partitioning gives its partition (the pairs it declares are its claim)."""

    def documents(partition: int) -> list[str]:
        return client_documents(
            cfg.data_root, cfg.task.companies, instantiate(cfg.task.partitioner), partition
        )

    reply = keys.discover_reply(
        messenger.partition_of, None if cfg is None else documents, messenger.num_partitions
    )
    nodes, records = discover(messenger, base, reply)
    return nodes, {
        partition_id: {
            keys.NUM_PAIRS: int(r[keys.NUM_PAIRS]),
            keys.COMPANIES: list(r[keys.COMPANIES]),
            keys.DOCUMENTS: len(r[keys.DOCUMENTS]),
        }
        for partition_id, r in records.items()
    }


@dataclass
class Context(RunContext):
    """A FedE4RAG runner's context: the shared one, the step budget and the initial weights."""

    budget: int
    initial: ArrayRecord | None = None  # the clients' common initial weights (plain FedAvg)
    finished: dict = field(default_factory=dict)  # method -> its results, as each one ends
    cost: dict = field(
        default_factory=dict
    )  # method -> its rounds' costs, filled by federated runs

    def train_config(
        self,
        method: str,
        weights: str,
        kd_weight: float,
        steps: int,
        threads: int,
        local: str | None = None,
    ) -> dict:
        p = self.cfg.protocol
        return {
            **self.base,
            keys.METHOD: method,
            keys.WEIGHTS: weights,
            keys.LOCAL_STEPS: steps,
            keys.BATCH_SIZE: p.batch_size,
            keys.LR: p.lr,
            keys.TEMPERATURE: p.temperature,
            keys.KD_WEIGHT: float(kd_weight),
            keys.SEED: self.cfg.seed,
            keys.TORCH_THREADS: threads,
            **({keys.LOCAL_MODEL: local} if local else {}),
        }

    def ask(
        self,
        node: int,
        message_type: str,
        config: dict,
        phase: str,
        reply: Validator,
        arrays: ArrayRecord | None = None,
        server_round: int = 1,
        rounds_of_work: int = 1,
    ) -> RecordDict:
        """One node, one message: the phase needs its reply (quorum: all), which must be ``reply``.
        A message carrying ``rounds_of_work`` rounds' worth of training waits that many
        ``round_timeout``s: the timeout follows the size of the work, so a long run alone is not
        cut short on a busy machine."""
        return self.ask_each(
            {node: config}, message_type, phase, reply, arrays, server_round, rounds_of_work
        )[0]

    def ask_each(
        self,
        configs: dict[int, dict],
        message_type: str,
        phase: str,
        reply: Validator,
        arrays: ArrayRecord | None = None,
        server_round: int = 1,
        rounds_of_work: int = 1,
    ) -> list[RecordDict]:
        """One message per node (node -> its config) in one exchange, as ``ask``; the replies'
        contents."""
        messages = []
        for node, config in configs.items():
            content = RecordDict({keys.CONFIG: ConfigRecord(config)})
            if arrays is not None:
                content[keys.ARRAYS] = arrays
            messages.append(Message(content, dst_node_id=node, message_type=message_type))
        replies = self.messenger.exchange(
            phase,
            messages,
            Policy(validator=reply),
            server_round,
            timeout=self.cfg.round_timeout * rounds_of_work,
        )
        return [msg.content for msg in replies]

    @property
    def pairs(self) -> Callable[[int], float]:
        """Each node's training pairs as it declared them: the most weight its reply carries."""
        return lambda node: float(self.info[self.partition_of(node)][keys.NUM_PAIRS])

    @property
    def budget_rounds(self) -> int:
        """How many rounds' worth of one client's training the whole budget is."""
        return math.ceil(self.budget / max(1, int(self.cfg.protocol.local_steps)))

    @property
    def evaluator(self) -> int:
        return self.nodes[int(self.cfg.protocol.evaluator_partition)]

    @property
    def encoders(self) -> list[int]:
        """The nodes that encode the corpus: the evaluator and the ``eval_nodes - 1`` after it."""
        first = int(self.cfg.protocol.evaluator_partition)
        return [
            self.nodes[(first + j) % len(self.nodes)]
            for j in range(int(self.cfg.protocol.eval_nodes))
        ]


def _threads(cfg: DictConfig, parallel: int) -> int:
    slots = max(1, int(cfg.hardware.num_cpus // max(cfg.hardware.client_cpus, 1)))
    return max(1, int(cfg.hardware.num_cpus) // max(1, min(parallel, slots)))
