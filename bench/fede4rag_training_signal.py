"""Which training signal lets the centralized reference beat the vanilla retriever on
FinanceBench's validation questions? Federated methods can only show something once it does.

For each variant (overrides of ``fede4rag_paper``, validation split only): the vanilla model and
the centralized reference (every company's pairs pooled in one process, the protocol's budget of
``num_rounds x local_steps x companies`` optimizer steps, the client's own pair construction and
local objective) encode the validation corpus and are scored. Prints one row per variant with
NDCG@10, Hit@10, MRR@10 of both and centralized minus vanilla, and writes them as JSON.

    .venv/bin/python bench/fede4rag_training_signal.py [--variants pages,passages,...] [--output F]

Corpus embeddings are cached per (weights, corpus) in ``--cache`` (vanilla once per corpus).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim_clients.retriever import RetrieverClient
from fedsim_tasks.financebench_rag.dataset import client_documents
from fedsim_tasks.financebench_rag.inference import corpus_encoder
from fedsim_tasks.financebench_rag.retrieval import (
    corpus_store,
    evaluation_data,
    score_splits,
    weights_key,
)
from fedsim_tasks.financebench_rag.train import train_encoder
from fedsim_tasks.hf import build_encoder, trainable_arrays

PASSAGES = ["task.passages.words=96"]
TITLES = ["task.passages.titles=true", "task.pseudo_queries.titles=true"]
UNTITLED = ["task.passages.titles=false", "task.pseudo_queries.titles=false"]
SLICE = [
    "task.corpus_pages_per_doc=40"
]  # screening: each filing's first 40 pages + every evidence page
VARIANTS = {  # name -> overrides of fede4rag_paper
    "pages": UNTITLED,
    "pages_temp1": [*UNTITLED, "protocol.temperature=1.0"],
    "pages_lr2e-5": [*UNTITLED, "protocol.lr=2e-5"],
    "passages": [*PASSAGES, *UNTITLED],
    "passages_titled_corpus": [
        *PASSAGES,
        "task.passages.titles=true",
        "task.pseudo_queries.titles=false",
    ],
    "passages_titles": [*PASSAGES, *TITLES],
    "pages_titles": TITLES,
    "pages_titles_lr2e-5": [*TITLES, "protocol.lr=2e-5"],
    "pages_titles_unique": [*TITLES, "task.pseudo_queries.construction=unique_inverse_cloze"],
    "pages_titles_headers": [*TITLES, "task.pseudo_queries.construction=headers"],
    "pages_unique": [*UNTITLED, "task.pseudo_queries.construction=unique_inverse_cloze"],
    "pages_headers": [*UNTITLED, "task.pseudo_queries.construction=headers"],
}
SHOWN = ("ndcg@10", "hit@10", "mrr@10")


def scores(model, task: dict, root: str, cache: Path, threads: int) -> dict:
    """The model's validation metrics (corpus encoded by the protocol's default backend)."""
    questions, corpus = evaluation_data(root, task)
    key = weights_key(task["model"], task["lora"], trainable_arrays(model))
    store = corpus_store(model, key, corpus, cache, len(corpus), "openvino")
    if store.missing():
        store.encode_piece(0, corpus_encoder(model, "openvino", threads), list(corpus.values()))
    metrics = score_splits(model, root, questions, list(corpus), store.load(), task, ["valid"])
    return {m: metrics[f"valid/{m}"] for m in SHOWN} | {"entries": metrics["valid/corpus-entries"]}


def centralized_pairs(task: dict, root: str) -> tuple[RetrieverClient, list]:
    """Every company's documents pooled on one client, as the protocol's ``centralized``."""
    client = RetrieverClient(task, root, 0, 0)
    n = RetrieverClient.population_size(task, root)
    documents = sorted(
        {
            d
            for partition_id in range(n)
            for d in client_documents(
                root, task["companies"], instantiate(task["partitioner"]), partition_id
            )
        }
    )
    return client, client._pairs(documents)


def variant(name: str, overrides: list[str], root: str, cache: Path, threads: int) -> dict:
    cfg = compose(["experiment=fede4rag_paper", "task.n_test=0", f"data_root={root}", *overrides])
    task, p = OmegaConf.to_container(cfg.task, resolve=True), cfg.protocol
    start = time.perf_counter()
    vanilla = scores(
        build_encoder(task["model"], task["max_seq_length"], task["lora"], task["seed"]),
        task,
        root,
        cache,
        threads,
    )
    client, pairs = centralized_pairs(task, root)
    n = RetrieverClient.population_size(task, root)
    steps = int(cfg.num_rounds) * int(p.local_steps) * n
    stats = train_encoder(
        client.model,
        pairs,
        steps,
        int(p.batch_size),
        float(p.lr),
        float(p.temperature),
        0.0,
        seed=int(cfg.seed),
        dropout=bool(task.get("train_dropout", False)),
    )
    central = scores(client.model, task, root, cache, threads)
    row = {
        "variant": name,
        "overrides": overrides,
        "pairs": len(pairs),
        "steps": steps,
        "train_loss": stats["loss"],
        "vanilla": vanilla,
        "centralized": central,
        "difference": {m: central[m] - vanilla[m] for m in SHOWN},
        "seconds": time.perf_counter() - start,
    }
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS"
    )
    ap.add_argument("--data-root", default="../shared/data")
    ap.add_argument("--cache", default="/tmp/fedsim-training-signal")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output", default="training_signal.json")
    ap.add_argument("--slice", action="store_true", help=f"screen on a smaller corpus: {SLICE}")
    args = ap.parse_args()
    rows = [
        variant(
            v,
            VARIANTS[v] + (SLICE if args.slice else []),
            args.data_root,
            Path(args.cache),
            args.threads,
        )
        for v in args.variants.split(",")
    ]
    Path(args.output).write_text(json.dumps(rows, indent=1))
    print(
        "| variant | pairs | vanilla ndcg@10 | centralized ndcg@10 | diff | vanilla hit@10 | centralized hit@10 |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        v, c = r["vanilla"], r["centralized"]
        print(
            f"| {r['variant']} | {r['pairs']} | {v['ndcg@10']:.4f} | {c['ndcg@10']:.4f} "
            f"| {r['difference']['ndcg@10']:+.4f} | {v['hit@10']:.2f} | {c['hit@10']:.2f} |"
        )


if __name__ == "__main__":
    main()
