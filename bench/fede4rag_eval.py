"""FedE4RAG evaluation cost: the torch corpus encoder against the compiled ones, in one run.

Default: the evaluator's work for one model, in this process: the offline MiniLM
with LoRA adapters moved off their init (as after training), the ``fede4rag_paper`` corpora
(valid + test questions; ``task.corpus_pages_per_doc=N`` for a slice), encoded in pieces of
``eval_pages_per_message`` by each backend in turn, then scored. Prints seconds (build =
merge + convert + compile), pages/s, the ratio against torch, the max |difference| of every
metric and the min cosine between each page's embeddings on the two paths.

``--experiment``: ``fedsim run experiment=fede4rag_paper`` once per backend and number of
encoding nodes (``--eval-nodes``, ``protocol.eval_nodes``), one after the other (the methods of
``--methods``, full training and corpora unless overridden); prints each method's training and
evaluation seconds from results.json and the ratios against the first run.

    .venv/bin/python bench/fede4rag_eval.py [--backends torch,openvino,onnx] [task.corpus_pages_per_doc=20]
    .venv/bin/python bench/fede4rag_eval.py --experiment --backends torch,openvino [--methods vanilla,fede4rag]
    .venv/bin/python bench/fede4rag_eval.py --experiment --backends openvino --eval-nodes 1,2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim_tasks.financebench_rag.inference import BACKENDS, corpus_encoder
from fedsim_tasks.financebench_rag.retrieval import evaluation_data, score_splits
from fedsim_tasks.hf import build_encoder, load_trainable, trainable_arrays

FEDSIM = str(Path(sys.executable).parent / "fedsim")
SPLITS = ["valid", "test"]


def encode(backends: list[str], overrides: list[str]) -> None:
    cfg = compose(["experiment=fede4rag_paper", *overrides])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    threads, piece = int(cfg.hardware.num_cpus), int(cfg.protocol.eval_pages_per_message)
    model = build_encoder(task["model"], task["max_seq_length"], task["lora"], task["seed"])
    rng = np.random.default_rng(0)
    load_trainable(
        model,
        {
            k: (v + rng.normal(0, 0.05, v.shape)).astype(np.float32)
            for k, v in trainable_arrays(model).items()
        },
    )
    questions, corpus = evaluation_data(cfg.data_root, task)
    ids, texts = list(corpus), list(corpus.values())
    rows = {}
    for backend in backends:
        start = time.perf_counter()
        encoder = corpus_encoder(model, backend, threads)
        built = time.perf_counter()
        emb = np.concatenate([encoder(texts[i : i + piece]) for i in range(0, len(texts), piece)])
        done = time.perf_counter()
        rows[backend] = (
            built - start,
            done - built,
            emb,
            score_splits(model, cfg.data_root, questions, ids, emb, task, SPLITS),
        )
        print(f"{backend}: {done - start:.1f} s", flush=True)
    ref_seconds = sum(rows[backends[0]][:2])
    ref_emb, ref_metrics = rows[backends[0]][2:]
    print(
        f"\n{len(texts)} pages ({sum(len(questions[s]) for s in SPLITS)} questions), {threads} threads, "
        f"pieces of {piece}; reference: {backends[0]}\n"
    )
    print(
        f"| backend | build s | encode s | pages/s | {backends[0]} s / backend s | max abs metric diff | "
        "min cosine | max abs embedding diff |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for backend, (build, seconds, emb, metrics) in rows.items():
        diff = max(abs(metrics[k] - ref_metrics[k]) for k in ref_metrics)
        print(
            f"| {backend} | {build:.1f} | {seconds:.1f} | {len(texts) / seconds:.1f} | "
            f"{ref_seconds / (build + seconds):.2f} | {diff:.1e} | {(emb * ref_emb).sum(1).min():.7f} | "
            f"{np.abs(emb - ref_emb).max():.1e} |"
        )


def experiment(
    backends: list[str], nodes: list[int], methods: list[str], overrides: list[str]
) -> None:
    every = OmegaConf.to_container(
        compose(["experiment=fede4rag_paper", *overrides]).protocol.methods, resolve=True
    )
    spec = (
        "{"
        + ", ".join(
            f"{m}: {{"
            + ", ".join(
                f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in every[m].items()
            )
            + "}"
            for m in methods
        )
        + "}"
    )
    out = Path(tempfile.mkdtemp(prefix="fede4rag-eval-"))
    runs = {}
    for backend in backends:
        for n in nodes:
            label = f"{backend} x{n}"
            folder = out / f"{backend}-{n}"
            start = time.perf_counter()
            subprocess.run(
                [
                    FEDSIM,
                    "run",
                    "experiment=fede4rag_paper",
                    f"protocol.eval_backend={backend}",
                    f"protocol.eval_nodes={n}",
                    f"task.embedding_cache={folder / 'cache'}",
                    f"task.he.key_dir={out / 'keys'}",
                    f"client_state.dir={folder / 'state'}",
                    f"results_dir={folder}",
                    "~protocol.methods",
                    f"+protocol.methods={spec}",
                    *overrides,
                ],
                check=True,
            )
            runs[label] = (
                time.perf_counter() - start,
                json.loads((folder / "results.json").read_text())["methods"],
            )
    first = next(iter(runs))
    ref_wall, ref = runs[first]
    print(
        f"\n| backend x encoding nodes | method | train s | eval s | eval {first} / eval | max abs metric diff |"
    )
    print("|---|---|---|---|---|---|")
    for label, (_, result) in runs.items():
        for name, m in result.items():
            diff = max(abs(m[s][k] - ref[name][s][k]) for s in SPLITS for k in m[s])
            print(
                f"| {label} | {name} | {m['train_seconds']:.0f} | {m['eval_seconds']:.0f} | "
                f"{ref[name]['eval_seconds'] / m['eval_seconds']:.2f} | {diff:.1e} |"
            )
    print(
        f"\n| backend x encoding nodes | wall s (fedsim run) | train s | eval s | {first} wall / wall |"
    )
    print("|---|---|---|---|---|")
    for label, (wall, result) in runs.items():
        print(
            f"| {label} | {wall:.0f} | {sum(m['train_seconds'] for m in result.values()):.0f} | "
            f"{sum(m['eval_seconds'] for m in result.values()):.0f} | {ref_wall / wall:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--experiment", action="store_true", help="whole fedsim runs, one per backend"
    )
    parser.add_argument(
        "--backends",
        default="torch,openvino,onnx",
        help=f"comma-separated, of {sorted(BACKENDS)}; the first is the reference",
    )
    parser.add_argument(
        "--eval-nodes",
        default="1",
        help="--experiment: comma-separated protocol.eval_nodes values, each run per backend",
    )
    parser.add_argument(
        "--methods",
        default="vanilla,fede4rag",
        help="--experiment: comma-separated methods of fede4rag_paper to run",
    )
    parser.add_argument(
        "overrides", nargs="*", help="fedsim overrides, e.g. task.corpus_pages_per_doc=20"
    )
    args = parser.parse_args()
    backends = args.backends.split(",")
    if unknown := set(backends) - set(BACKENDS):
        parser.error(f"--backends: {sorted(unknown)} not in {sorted(BACKENDS)}")
    if args.experiment:
        experiment(
            backends,
            [int(n) for n in args.eval_nodes.split(",")],
            args.methods.split(","),
            args.overrides,
        )
    else:
        encode(backends, args.overrides)


if __name__ == "__main__":
    main()
