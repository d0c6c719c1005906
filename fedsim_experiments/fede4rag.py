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

Each method is a function named by ``run`` in ``protocol.methods`` (no dispatcher here).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig

from fedsim.he import messages as he_keys
from fedsim.messaging import ANY, Messenger, PhaseFailed, Policy, client_config
from fedsim.records import from_record
from fedsim.results import RunOutput, markdown_table
from fedsim.schema import Protocol
from fedsim.validators import Validator
from fedsim_clients import fede4rag_messages as keys
from fedsim_experiments.common import RunContext, build_strategy, discover
from fedsim_strategies.client_spread import ClientSpread
from fedsim_tasks.financebench_rag.dataset import client_documents
from fedsim_tasks.financebench_rag.inference import BACKENDS
from fedsim_tasks.financebench_rag.retrieval import METRICS, weights_key

log = logging.getLogger("fedsim")


@dataclass(frozen=True, kw_only=True)
class FedE4RAGProtocol(Protocol):
    """FedE4RAG's protocol settings (``conf/experiment/fede4rag_paper.yaml``)."""
    local_steps: int             # optimizer steps per client and round
    batch_size: int              # pairs per step (in-batch negatives)
    lr: float                    # AdamW learning rate, constant
    temperature: float           # InfoNCE temperature
    kd_weight: float             # weight of KD-GLE in FedE4RAG
    evaluator_partition: int     # the client that evaluates (under HE only clients hold the model)
    he_chunk_floats: int         # floats per encrypted chunk
    eval_pages_per_message: int  # corpus pages one evaluation message encodes
    eval_backend: str            # corpus encoder: torch | openvino | onnx (float32) | openvino_bf16
    eval_nodes: int              # clients that encode corpus pieces side by side (a shared store)
    eval_local: bool             # also evaluate each company's own retriever (methods with local_models)
    eval_per_filing: bool        # also score each question within its own filing's pages
    methods: dict[str, Any]
    """name -> {run: runner function, ...its settings}, in run order; null leaves a method out"""

    def he_methods(self) -> list[str]:
        return [name for name, spec in self.methods.items() if spec and spec.get("he")]

    def __post_init__(self):
        if self.eval_backend not in BACKENDS:
            raise ValueError(f"protocol.eval_backend={self.eval_backend!r} is not one of {sorted(BACKENDS)}")
        if self.eval_nodes < 1:
            raise ValueError(f"protocol.eval_nodes={self.eval_nodes} must be >= 1")

    def check_run(self, cfg: DictConfig, clients: int | None) -> None:
        """The evaluator and the encoding nodes must be clients of the federation."""
        if clients is not None and not (self.eval_nodes <= clients and 0 <= self.evaluator_partition < clients):
            raise ValueError(f"protocol.eval_nodes={self.eval_nodes} and protocol.evaluator_partition="
                             f"{self.evaluator_partition} need a federation of at least that many clients, "
                             f"this one has {clients}")


@dataclass
class Context(RunContext):
    """A FedE4RAG runner's context: the shared one, the step budget and the initial weights."""
    budget: int
    initial: ArrayRecord | None = None  # the clients' common initial weights (plain FedAvg)
    cost: dict = field(default_factory=dict)  # method -> its rounds' costs, filled by federated runs

    def train_config(self, method: str, weights: str, kd_weight: float, steps: int,
                     threads: int, local: str | None = None) -> dict:
        p = self.cfg.protocol
        return {**self.base, keys.METHOD: method, keys.WEIGHTS: weights,
                keys.LOCAL_STEPS: steps, keys.BATCH_SIZE: p.batch_size, keys.LR: p.lr,
                keys.TEMPERATURE: p.temperature, keys.KD_WEIGHT: float(kd_weight),
                keys.SEED: self.cfg.seed, keys.TORCH_THREADS: threads,
                **({keys.LOCAL_MODEL: local} if local else {})}

    def ask(self, node: int, message_type: str, config: dict, phase: str, reply: Validator,
            arrays: ArrayRecord | None = None, server_round: int = 1, rounds_of_work: int = 1) -> RecordDict:
        """One node, one message: the phase needs its reply (quorum: all), which must be ``reply``.
        A message carrying ``rounds_of_work`` rounds' worth of training waits that many
        ``round_timeout``s: the timeout follows the size of the work, so a long run alone is not
        cut short on a busy machine."""
        return self.ask_each({node: config}, message_type, phase, reply, arrays, server_round, rounds_of_work)[0]

    def ask_each(self, configs: dict[int, dict], message_type: str, phase: str, reply: Validator,
                 arrays: ArrayRecord | None = None, server_round: int = 1,
                 rounds_of_work: int = 1) -> list[RecordDict]:
        """One message per node (node -> its config) in one exchange, as ``ask``; the replies'
        contents."""
        messages = []
        for node, config in configs.items():
            content = RecordDict({keys.CONFIG: ConfigRecord(config)})
            if arrays is not None:
                content[keys.ARRAYS] = arrays
            messages.append(Message(content, dst_node_id=node, message_type=message_type))
        replies = self.messenger.exchange(phase, messages, Policy(validator=reply), server_round,
                                          timeout=self.cfg.round_timeout * rounds_of_work)
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
        return [self.nodes[(first + j) % len(self.nodes)] for j in range(int(self.cfg.protocol.eval_nodes))]



def _threads(cfg: DictConfig, parallel: int) -> int:
    slots = max(1, int(cfg.hardware.num_cpus // max(cfg.hardware.client_cpus, 1)))
    return max(1, int(cfg.hardware.num_cpus) // max(1, min(parallel, slots)))


@dataclass
class Trained:
    """What a runner produced: the weights to evaluate and what to report."""
    source: str                        # keys.FROM_INITIAL | FROM_ARRAYS | FROM_HE
    details: dict
    arrays: ArrayRecord | None = None  # FROM_ARRAYS: the model the server holds
    he_round: int = 0                  # FROM_HE: the round of the clients' aggregate
    local: str | None = None           # the name each company keeps its own retriever under


def vanilla(ctx: Context, name: str, spec: DictConfig) -> Trained:
    return Trained(keys.FROM_INITIAL, {"steps": 0})


def alone(ctx: Context, name: str, spec: DictConfig) -> Trained:
    """One client trains on its own pairs for the whole budget (largest or smallest client)."""
    sizes = {partition_id: info[keys.NUM_PAIRS] for partition_id, info in ctx.info.items()}
    pick = max(sizes, key=sizes.get) if spec.which == "largest" else min(sizes, key=sizes.get)
    config = ctx.train_config(name, keys.FROM_INITIAL, 0.0, ctx.budget, _threads(ctx.cfg, 1))
    reply = ctx.ask(ctx.nodes[pick], MessageType.TRAIN, config, f"{name}/train",
                    keys.train_reply(None, ctx.pairs, None), rounds_of_work=ctx.budget_rounds)
    return Trained(keys.FROM_ARRAYS, {"steps": ctx.budget, "partition": pick,
                                      "pairs": sizes[pick],
                                      "companies": ctx.info[pick][keys.COMPANIES]},
                   reply[keys.ARRAYS])


def centralized(ctx: Context, name: str, spec: DictConfig) -> Trained:
    """The union of every client's pairs on one node: the non-private upper reference."""
    config = {**ctx.train_config(name, keys.FROM_INITIAL, 0.0, ctx.budget, _threads(ctx.cfg, 1)),
              keys.POOL_PARTITIONS: sorted(ctx.nodes)}
    pooled = sum(i[keys.NUM_PAIRS] for i in ctx.info.values())
    reply = ctx.ask(ctx.evaluator, MessageType.TRAIN, config, f"{name}/train",
                    keys.train_reply(None, pooled, None), rounds_of_work=ctx.budget_rounds)
    return Trained(keys.FROM_ARRAYS, {"steps": ctx.budget,
                                      "pairs": int(reply[keys.METRICS][keys.NUM_EXAMPLES])},
                   reply[keys.ARRAYS])


def federated(ctx: Context, name: str, spec: DictConfig) -> Trained:
    """The slot's strategy (``strategy`` in ``privacy``'s wrapper) for ``num_rounds`` (quorum per
    round: any client); with ``he`` wrapped in HEFedAvg (``one_trip``, default true: an update
    that fits one message travels encrypted in the train reply; false: always the chunk phases).
    In plaintext the rounds' metrics include how far apart the client models are
    (``ClientSpread``)."""
    rounds, threads = int(ctx.cfg.num_rounds), _threads(ctx.cfg, len(ctx.nodes))
    he = {"_target_": "fedsim_strategies.he_fedavg.HEFedAvg", "chunk_floats": ctx.cfg.protocol.he_chunk_floats,
          "one_trip": bool(spec.get("one_trip", True))} if spec.he else None
    strategy = build_strategy(ctx.cfg, ctx.messenger, len(ctx.nodes), he=he)
    local = f"retriever-{name}" if spec.get("local_models", False) else None
    if spec.he or ctx.cfg.privacy.kind == "he":
        config = ConfigRecord(ctx.train_config(name, keys.FROM_HE, spec.kd_weight,
                                               ctx.cfg.protocol.local_steps, threads, local))
        grid = ctx.grid(name).checked(MessageType.TRAIN, keys.he_train_weight(ctx.pairs))
        result = strategy.start(grid, ArrayRecord(), rounds, ctx.cfg.round_timeout, config)
        ctx.cost[name] = list(strategy.rounds.values())
        return Trained(keys.FROM_HE, {"steps": ctx.budget, "rounds": _round_metrics(result)},
                       he_round=rounds, local=local)
    config = ConfigRecord(ctx.train_config(name, keys.FROM_ARRAYS, spec.kd_weight,
                                           ctx.cfg.protocol.local_steps, threads, local))
    start = time.perf_counter()
    reply = keys.train_reply(_initial(ctx), ctx.pairs, ctx.cfg.protocol.strategy_slot.loss_key)
    result = ClientSpread(strategy).start(ctx.grid(name, Policy(ANY, reply)), _initial(ctx), rounds,
                                          ctx.cfg.round_timeout, config)
    seconds = (time.perf_counter() - start) / rounds
    traffic = [ctx.messenger.round_traffic(f"{name}/train", r) for r in range(1, rounds + 1)]
    ctx.cost[name] = [{"round-seconds": seconds, "bytes-up-per-client": t["bytes_up"] / t["messages"]}
                      for t in traffic]
    return Trained(keys.FROM_ARRAYS, {"steps": ctx.budget, "rounds": _round_metrics(result)},
                   result.arrays, local=local)


def _initial(ctx: Context) -> ArrayRecord:
    """The clients' common initial weights, asked once of the evaluator, so round 1 sends a
    real model like every other round."""
    if ctx.initial is None:
        config = {**ctx.base, keys.QUERY_OP: keys.INITIAL_WEIGHTS}
        ctx.initial = ctx.ask(ctx.evaluator, MessageType.QUERY, config, "initial-weights",
                              keys.weights_reply())[keys.ARRAYS]
    return ctx.initial


def _round_metrics(result) -> dict:
    return {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}


def _encode_corpus(ctx: Context, name: str, trained: Trained, config: dict,
                   encoders: list[int]) -> None:
    """Encode the corpus one bounded piece per message (each reply's work is capped by
    ``eval_pages_per_message``, so ``round_timeout`` holds on a busy machine), on the
    ``encoders`` side by side: each wave gives each encoder one missing piece. A piece is
    missing after a wave only if every encoder saw it missing after its own; one the wave asked
    for is encoded by then, else the encoding stops here (it would never end)."""
    start = time.perf_counter()
    config = {**config, keys.EVAL_OP: keys.ENCODE, keys.TORCH_THREADS: _threads(ctx.cfg, len(encoders))}
    todo, wave = list(range(len(encoders))), 0  # the number of pieces is known after wave 1
    pages = int(ctx.cfg.protocol.eval_pages_per_message)
    while todo:
        wave += 1
        asked = dict(zip(encoders, todo))
        replies = ctx.ask_each({node: {**config, keys.PIECE: i} for node, i in asked.items()},
                               MessageType.EVALUATE, f"eval/{name}/encode", keys.encode_reply(pages),
                               None if config[keys.WEIGHTS] == keys.FROM_LOCAL else trained.arrays,
                               server_round=wave)
        pieces = int(replies[0][keys.METRICS][keys.PIECES])
        todo = sorted(set.intersection(*(set(r[keys.METRICS][keys.MISSING]) for r in replies)))
        log.info("[eval %s] corpus pieces %d/%d encoded on %d node(s), %.0f s", name, pieces - len(todo),
                 pieces, len(encoders), time.perf_counter() - start)
        if set(todo) & set(asked.values()):
            raise PhaseFailed(f"eval {name}: corpus encoding makes no progress ({len(todo)} pieces left, "
                              f"those of wave {wave} among them)")


def _evaluate(ctx: Context, name: str, trained: Trained, node: int | None = None) -> dict:
    """Encode the corpus, then score on the evaluator (``node``: that node alone, on its own
    local retriever). The weights the client evaluated must be the ones the method produced
    (the server can check it where it holds them)."""
    own = node is not None
    source = keys.FROM_LOCAL if own else trained.source
    config = {**ctx.base, keys.METHOD: name, keys.WEIGHTS: source, keys.SPLITS: splits(ctx.cfg),
              **({he_keys.GLOBAL_ROUND: trained.he_round} if source == keys.FROM_HE else {}),  # the HE layer's
              keys.PER_FILING: bool(ctx.cfg.protocol.eval_per_filing),
              keys.TORCH_THREADS: _threads(ctx.cfg, 1),
              keys.PAGES_PER_MESSAGE: int(ctx.cfg.protocol.eval_pages_per_message),
              keys.EVAL_BACKEND: str(ctx.cfg.protocol.eval_backend),
              **({keys.LOCAL_MODEL: trained.local} if own else {})}
    label, arrays = (f"{name}/local", None) if own else (name, trained.arrays)
    _encode_corpus(ctx, label, trained, config, [node] if own else ctx.encoders)
    task = ctx.cfg.task
    expected = None if own or trained.source == keys.FROM_HE else \
        weights_key(task.model, task.lora, None if trained.arrays is None else from_record(trained.arrays))
    reply = ctx.ask(node if own else ctx.evaluator, MessageType.EVALUATE, {**config, keys.EVAL_OP: keys.SCORE},
                    f"eval/{label}/score", keys.score_reply(scored(ctx.cfg), METRICS, expected), arrays)
    evaluated = reply[keys.WEIGHTS_INFO][keys.WEIGHTS_KEY]
    metrics = reply[keys.METRICS]
    return {"weights_key": evaluated} | {
        split: {m: float(metrics[f"{split}/{m}"]) for m in METRICS}
        | {"questions": int(metrics[f"{split}/questions"]),
           "corpus_pages": int(metrics[f"{split}/corpus-pages"])}
        | ({"corpus_entries": int(metrics[f"{split}/corpus-entries"])} if f"{split}/corpus-entries" in metrics else {})
        for split in scored(ctx.cfg)}


def _evaluate_local(ctx: Context, name: str, trained: Trained, global_scores: dict) -> dict:
    """Each company's own retriever on its own node (one after the other, each with every
    thread), or the global model's scores for each company where the method keeps no local
    model: ``<split>.<metric>`` the mean over companies, ``spread`` its std / min / max,
    ``clients`` every company's scores."""
    clients, own = {}, bool(trained.local and ctx.cfg.protocol.eval_local)
    for partition_id, node in sorted(ctx.nodes.items()):
        clients[str(partition_id)] = _evaluate(ctx, name, trained, node) if own else \
            {s: global_scores[s] for s in scored(ctx.cfg)}
    out = {"model": "own" if own else "global", "clients": clients, "spread": {}}
    for split in scored(ctx.cfg):
        values = {m: np.array([c[split][m] for c in clients.values()]) for m in METRICS}
        out[split] = {m: float(v.mean()) for m, v in values.items()}
        out["spread"][split] = {m: {"std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                                    "min": float(v.min()), "max": float(v.max())} for m, v in values.items()}
    if own:
        log.info("[fede4rag] %s local retrievers: %s", name, ", ".join(
            f"{s} ndcg@10 {out[s]['ndcg@10']:.4f} (min {out['spread'][s]['ndcg@10']['min']:.4f})"
            for s in scored(ctx.cfg)))
    return out


def splits(cfg: DictConfig) -> list[str]:
    """The question splits the task holds (``task.n_test=0``: validation only)."""
    return [s for s in ("valid", "test") if int(cfg.task[f"n_{s}"])]


def scored(cfg: DictConfig) -> list[str]:
    """What an evaluation reports: each split on the shared corpus (``valid``), and with
    ``eval_per_filing`` within each question's own filing (``valid-filing``)."""
    corpora = ["", "-filing"] if cfg.protocol.eval_per_filing else [""]
    return [f"{s}{corpus}" for corpus in corpora for s in splits(cfg)]


def scored_in(method: dict) -> list[str]:
    """The evaluation labels in one method's results, in the order scored."""
    return [k for k, v in method.items() if isinstance(v, dict) and "questions" in v]


def _cost_summary(rounds: list[dict]) -> dict:
    n = max(len(rounds), 1)
    mean = lambda key: sum(r.get(key, 0.0) for r in rounds) / n  # noqa: E731
    out = {"rounds": len(rounds), "bytes_per_client_round": mean("bytes-up-per-client"),
           "seconds_per_round": mean("round-seconds")}
    if rounds and "encrypt-seconds-per-client" in rounds[0]:
        out |= {"aggregate_seconds_per_round": mean("aggregate-seconds"),
                "encrypt_seconds_per_client_round": mean("encrypt-seconds-per-client"),
                "decrypt_seconds_per_client_round": mean("decrypt-seconds-per-client"),
                "bytes_down_per_client_round": mean("bytes-down-per-client")}
    return out


def _discover(messenger: Messenger, base: dict, cfg: DictConfig | None = None
              ) -> tuple[dict[int, int], dict[int, dict]]:
    """Every company's node; where ``cfg`` is given, each must hold exactly the documents the
    public partitioning gives its partition (the pairs it declares are its claim)."""
    def documents(partition: int) -> list[str]:
        return client_documents(cfg.data_root, cfg.task.companies, instantiate(cfg.task.partitioner), partition)
    reply = keys.discover_reply(messenger.partition_of, None if cfg is None else documents, messenger.num_partitions)
    nodes, records = discover(messenger, base, reply)
    return nodes, {partition_id: {keys.NUM_PAIRS: int(r[keys.NUM_PAIRS]), keys.COMPANIES: list(r[keys.COMPANIES]),
                                  keys.DOCUMENTS: len(r[keys.DOCUMENTS])} for partition_id, r in records.items()}


def train_and_evaluate(ctx: Context, name: str, spec: DictConfig) -> dict:
    """One method: its runner (``spec.run``), then the evaluation of what it produced."""
    start = time.perf_counter()
    trained = get_method(spec.run)(ctx, name, spec)
    train_s = time.perf_counter() - start
    scores = _evaluate(ctx, name, trained)
    if spec.run.endswith(".federated"):
        scores["local"] = _evaluate_local(ctx, name, trained, scores)
    log.info("[fede4rag] %s: %s (%.0f s)", name, ", ".join(
        f"{s} ndcg@10 {scores[s]['ndcg@10']:.4f}" for s in scored(ctx.cfg)), time.perf_counter() - start)
    return {**scores, "train_seconds": train_s, "eval_seconds": time.perf_counter() - start - train_s,
            **trained.details}


def context(messenger: Messenger, cfg: DictConfig) -> Context:
    """The runners' context: every client discovered, the step budget (a function of its own, so
    that a test drives a runner with the messages a run sends)."""
    base = client_config(cfg)
    nodes, info = _discover(messenger, base, cfg)
    return Context(messenger, cfg, base, nodes, info, int(cfg.num_rounds * cfg.protocol.local_steps * len(nodes)))


def run(messenger: Messenger, cfg: DictConfig, out: RunOutput) -> tuple[dict, str]:
    ctx = context(messenger, cfg)
    info, budget = ctx.info, ctx.budget
    log.info("[fede4rag] %d clients %s; budget %d optimizer steps per method", len(ctx.nodes),
             {partition_id: (i[keys.COMPANIES], i[keys.NUM_PAIRS]) for partition_id, i in sorted(info.items())},
             budget)
    results = {"clients": {str(k): v for k, v in sorted(info.items())}, "budget_steps": budget,
               "methods": {}, "round_cost": {}}
    for name, spec in cfg.protocol.methods.items():
        if spec is not None:  # an experiment leaves a method out by setting it to null
            results["methods"][name] = train_and_evaluate(ctx, name, spec)
    for name, rounds in ctx.cost.items():  # per method: compare HE with the plaintext run of equal KD
        results["round_cost"][name] = _cost_summary(rounds)
    return results, _summary(results, out)


def _summary(r: dict, out: RunOutput) -> str:
    columns = ["method", "hit@1", "hit@10", "mrr@10", "map@10", "ndcg@10", "recall@1",
               "recall@5", "recall@10", "precision@1", "precision@5", "precision@10"]
    tables = []
    for split in scored_in(next(iter(r["methods"].values()))):
        rows = [{"method": name, **m[split]} for name, m in r["methods"].items()]
        first = next(iter(r["methods"].values()))[split]
        tables.append(f"## {split} ({first['questions']} questions, {first['corpus_pages']} "
                      f"corpus pages)\n" + markdown_table(rows, columns))
    local = [{"method": name, "split": split, "model": m["local"]["model"],
              **{k: f"{m['local'][split][k]:.4f} ± {m['local']['spread'][split][k]['std']:.4f}"
                 for k in ("hit@10", "mrr@10", "ndcg@10", "recall@10")}}
             for name, m in r["methods"].items() if "local" in m for split in scored_in(m)]
    if local:
        tables.append("## Each company's retriever (mean ± std over companies; `global`: the "
                      "method keeps no local model)\n" + markdown_table(
                          local, ["method", "split", "model", "hit@10", "mrr@10", "ndcg@10", "recall@10"]))
    cost = [{"method": k, **v} for k, v in r["round_cost"].items()]
    if cost:
        tables.append("## Round cost (mean per round)\n" + markdown_table(
            cost, ["method", "bytes_per_client_round", "seconds_per_round",
                   "aggregate_seconds_per_round", "encrypt_seconds_per_client_round",
                   "decrypt_seconds_per_client_round"]))
    _plot(r, out)
    return (f"# FedE4RAG on FinanceBench\n\nBudget: {r['budget_steps']} optimizer steps per "
            f"trained method.\n\n" + "\n\n".join(tables) + "\n")


def _plot(r: dict, out: RunOutput) -> None:
    names = list(r["methods"])
    fig, ax, save = out.figure("retrieval_by_method")
    bars = [(split, metric) for metric in ("ndcg@10", "hit@10")
            for split in scored_in(r["methods"][names[0]])]
    width = 0.8 / len(bars)
    for i, (split, metric) in enumerate(bars):
        ax.bar([x + (i - (len(bars) - 1) / 2) * width for x in range(len(names))],
               [r["methods"][n][split][metric] for n in names], width, label=f"{split} {metric}")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_xlabel("method")
    ax.set_ylabel("retrieval score on test questions (0 to 1)")
    ax.set_title("FinanceBench retrieval by method")
    ax.legend(fontsize=7)
    save()
