"""FedE4RAG's experiment protocol (METHODS.md section 3), run inside the ServerApp.

Every method gets the same budget of optimizer steps, counted over all clients:
``num_rounds * local_steps * clients``. The vanilla model trains nothing; a client alone and
the centralized baseline (one node pooling every client's documents: the non-private oracle)
spend the whole budget on one node; the federated methods spend ``local_steps`` per client and
round. Evaluation runs on one node (``evaluator_partition``), because under HE only clients
ever hold the global model; the server receives metrics only.

Each method is a function named by ``run`` in ``protocol.methods`` (no dispatcher here).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from hydra.utils import get_method, instantiate
from omegaconf import DictConfig

from fedsim.grid import ProgressGrid
from fedsim.protocols import client_setup
from fedsim.reply_guard import ReplyGuard, finite_arrays_validator
from fedsim.results import RunOutput, markdown_table
from strategies.he_fedavg import HEFedAvg
from tasks.financebench_rag.retrieval import METRICS

log = logging.getLogger("fedsim")


@dataclass
class Context:
    """What a method runner needs: grid, config, nodes by partition and the shared config."""
    grid: ProgressGrid
    cfg: DictConfig
    base: dict
    nodes: dict[int, int]  # partition id -> node id
    info: dict[int, dict]  # partition id -> node info
    budget: int
    cost: dict = field(default_factory=dict)  # he/plain round costs, filled by federated runs

    def train_config(self, kd_weight: float, steps: int, threads: int) -> dict:
        p = self.cfg.protocol
        return {**self.base, "local-steps": steps, "batch-size": p.batch_size, "lr": p.lr,
                "temperature": p.temperature, "kd-weight": float(kd_weight),
                "seed": self.cfg.seed, "torch-threads": threads}

    def ask(self, node: int, message_type: str, config: dict, label: str,
            arrays: ArrayRecord | None = None) -> RecordDict:
        content = RecordDict({"config": ConfigRecord(config)})
        if arrays is not None:
            content["arrays"] = arrays
        replies = list(self.grid.subset([node], label).send_and_receive(
            [Message(content, dst_node_id=node, message_type=message_type)],
            timeout=self.cfg.round_timeout))
        if not replies or replies[0].has_error():
            reason = replies[0].error.reason if replies else "timed out"
            raise RuntimeError(f"{label}: node {node} failed: {reason}")
        return replies[0].content


def _threads(cfg: DictConfig, parallel: int) -> int:
    slots = max(1, int(cfg.hardware.num_cpus // max(cfg.hardware.client_cpus, 1)))
    return max(1, int(cfg.hardware.num_cpus) // max(1, min(parallel, slots)))


def vanilla(ctx: Context, spec: DictConfig) -> tuple[str, ArrayRecord | None, dict]:
    return "initial", None, {"steps": 0}


def alone(ctx: Context, spec: DictConfig):
    """One client trains on its own pairs for the whole budget (largest or smallest client)."""
    sizes = {pid: info["num-pairs"] for pid, info in ctx.info.items()}
    pick = max(sizes, key=sizes.get) if spec.which == "largest" else min(sizes, key=sizes.get)
    config = ctx.train_config(0.0, ctx.budget, _threads(ctx.cfg, 1))
    reply = ctx.ask(ctx.nodes[pick], MessageType.TRAIN, config, f"alone-{spec.which}")
    return "arrays", reply["arrays"], {"steps": ctx.budget, "partition": pick,
                                       "pairs": sizes[pick], "companies": ctx.info[pick]["companies"]}


def centralized(ctx: Context, spec: DictConfig):
    """The union of every client's pairs on one node: the non-private upper reference."""
    config = {**ctx.train_config(0.0, ctx.budget, _threads(ctx.cfg, 1)),
              "pool-partitions": sorted(ctx.nodes)}
    pid = int(ctx.cfg.protocol.evaluator_partition)
    reply = ctx.ask(ctx.nodes[pid], MessageType.TRAIN, config, "centralized")
    return "arrays", reply["arrays"], {"steps": ctx.budget,
                                       "pairs": int(reply["metrics"]["num-examples"])}


def federated(ctx: Context, spec: DictConfig):
    """The configured strategy for ``num_rounds``; with ``he`` wrapped in HEFedAvg."""
    p = ctx.cfg.protocol
    config = ConfigRecord(ctx.train_config(spec.kd_weight, p.local_steps,
                                           _threads(ctx.cfg, len(ctx.nodes))))
    strategy = instantiate(ctx.cfg.strategy)
    if spec.he:
        wrapper = HEFedAvg(strategy, chunk_floats=p.he_chunk_floats)
        result = wrapper.start(ctx.grid, ArrayRecord(), p.num_rounds, ctx.cfg.round_timeout,
                               config)
        ctx.cost["he"] = list(wrapper.rounds.values())
        return "he-global", None, {"steps": ctx.budget, "rounds": _round_metrics(result)}
    guard = ReplyGuard(strategy, finite_arrays_validator)
    result = guard.start(ctx.grid, ArrayRecord(), p.num_rounds, ctx.cfg.round_timeout, config)
    ctx.cost.setdefault("plain", list(guard.cost.values()))
    if not len(result.arrays):
        raise RuntimeError("federated training produced no global model (every reply failed)")
    return "arrays", result.arrays, {"steps": ctx.budget, "rounds": _round_metrics(result),
                                     "faults": guard.faults}


def _round_metrics(result) -> dict:
    return {int(r): dict(m) for r, m in result.train_metrics_clientapp.items()}


def _evaluate(ctx: Context, source: str, arrays: ArrayRecord | None, label: str) -> dict:
    pid = int(ctx.cfg.protocol.evaluator_partition)
    config = {**ctx.base, "weights": source, "splits": ["valid", "test"],
              "torch-threads": _threads(ctx.cfg, 1)}
    metrics = ctx.ask(ctx.nodes[pid], MessageType.EVALUATE, config, f"eval {label}",
                      arrays)["metrics"]
    return {split: {m: float(metrics[f"{split}/{m}"]) for m in METRICS}
            | {"questions": int(metrics[f"{split}/questions"]),
               "corpus_pages": int(metrics[f"{split}/corpus-pages"])}
            for split in ("valid", "test")}


def _cost_summary(rounds: list[dict]) -> dict:
    n = max(len(rounds), 1)
    mean = lambda key: sum(r.get(key, 0.0) for r in rounds) / n  # noqa: E731
    out = {"rounds": len(rounds), "bytes_per_client_round": mean("bytes-up-per-client"),
           "seconds_per_round": mean("round-seconds"),
           "aggregate_seconds_per_round": mean("aggregate-seconds")}
    if rounds and "encrypt-seconds-per-client" in rounds[0]:
        out |= {"encrypt_seconds_per_client_round": mean("encrypt-seconds-per-client"),
                "decrypt_seconds_per_client_round": mean("decrypt-seconds-per-client"),
                "bytes_down_per_client_round": mean("bytes-down-per-client")}
    return out


def run(grid: ProgressGrid, cfg: DictConfig, out: RunOutput) -> tuple[dict, str]:
    _, base = client_setup(cfg)
    node_ids = list(grid.get_node_ids())
    replies = grid.subset(node_ids, "discover").send_and_receive(
        [Message(RecordDict({"config": ConfigRecord(base)}), dst_node_id=n,
                 message_type=MessageType.QUERY) for n in node_ids], timeout=cfg.round_timeout)
    info, nodes = {}, {}
    for msg in replies:
        if msg.has_error():
            raise RuntimeError(f"discover: node {msg.metadata.src_node_id} failed: "
                               f"{msg.error.reason}")
        record = msg.content["info"]
        pid = int(record["partition-id"])
        nodes[pid] = msg.metadata.src_node_id
        info[pid] = {"num-pairs": int(record["num-pairs"]), "companies": list(record["companies"]),
                     "documents": len(record["documents"])}
    if len(nodes) < len(node_ids):
        raise RuntimeError(f"discover: {len(node_ids) - len(nodes)} node(s) did not answer")
    p = cfg.protocol
    budget = int(p.num_rounds * p.local_steps * len(nodes))
    ctx = Context(grid, cfg, base, nodes, info, budget)
    log.info("[fede4rag] %d clients %s; budget %d optimizer steps per method", len(nodes),
             {pid: (i["companies"], i["num-pairs"]) for pid, i in sorted(info.items())}, budget)
    results = {"clients": {str(k): v for k, v in sorted(info.items())}, "budget_steps": budget,
               "methods": {}, "he": {}}
    for name, spec in p.methods.items():
        start = time.perf_counter()
        source, arrays, details = get_method(spec.run)(ctx, spec)
        train_s = time.perf_counter() - start
        scores = _evaluate(ctx, source, arrays, name)
        results["methods"][name] = {**scores, "train_seconds": train_s,
                                    "eval_seconds": time.perf_counter() - start - train_s,
                                    **details}
        log.info("[fede4rag] %s: valid ndcg@10 %.4f, test ndcg@10 %.4f (%.0f s)", name,
                 scores["valid"]["ndcg@10"], scores["test"]["ndcg@10"],
                 time.perf_counter() - start)
    for kind, rounds in ctx.cost.items():
        results["he"][kind] = _cost_summary(rounds)
    return results, _summary(results, out)


def _summary(r: dict, out: RunOutput) -> str:
    columns = ["method", "hit@1", "hit@10", "mrr@10", "map@10", "ndcg@10", "recall@1",
               "recall@5", "recall@10", "precision@1", "precision@5", "precision@10"]
    tables = []
    for split in ("valid", "test"):
        rows = [{"method": name, **m[split]} for name, m in r["methods"].items()]
        first = next(iter(r["methods"].values()))[split]
        tables.append(f"## {split} ({first['questions']} questions, {first['corpus_pages']} "
                      f"corpus pages)\n" + markdown_table(rows, columns))
    cost = [{"aggregation": k, **v} for k, v in r["he"].items()]
    if cost:
        tables.append("## Round cost (mean per round)\n" + markdown_table(
            cost, ["aggregation", "bytes_per_client_round", "seconds_per_round",
                   "aggregate_seconds_per_round", "encrypt_seconds_per_client_round",
                   "decrypt_seconds_per_client_round"]))
    _plot(r, out)
    return (f"# FedE4RAG on FinanceBench\n\nBudget: {r['budget_steps']} optimizer steps per "
            f"trained method.\n\n" + "\n\n".join(tables) + "\n")


def _plot(r: dict, out: RunOutput) -> None:
    names = list(r["methods"])
    fig, ax, save = out.figure("retrieval_by_method")
    width = 0.2
    for i, (split, metric) in enumerate([("valid", "ndcg@10"), ("test", "ndcg@10"),
                                         ("valid", "hit@10"), ("test", "hit@10")]):
        ax.bar([x + (i - 1.5) * width for x in range(len(names))],
               [r["methods"][n][split][metric] for n in names], width, label=f"{split} {metric}")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylabel("score")
    ax.set_title("FinanceBench retrieval by method")
    ax.legend(fontsize=7)
    save()
