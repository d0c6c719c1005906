"""Throughput of the task layer's steps on one device: the same steps, the same MiniLM
and the papers' batch settings on the GPU and on the CPU, to give GPU / CPU ratios.

Steps (MiniLM, LoRA r 8 on query / value as the experiments configure it; synthetic 128-token
texts, so no data is needed):
- ``retriever_train``: FedE4RAG's local step (InfoNCE + KD-GLE, sentence-transformers' trainer), batch 16, 128 tokens
- ``corpus_encode``: the corpus encoder (``eval_backend=torch``), batch 32, 128 tokens; encodings/s
- ``trust_train``: FedDTRE's trust evaluator, batch 16, context 128 + response 64 tokens
- ``selector_train``: FedBiscuit's scorer selector with LoRA adapters (``frozen: false``), batch 32, 128 tokens
- ``policy_sft`` / ``policy_dpo``: the MiniLM causal decoder with LoRA, SFT batch 16, DPO batch 8, 128 tokens

Each step runs once untimed (start-up, kernel choice) and then ``--steps`` times; a GPU step
synchronizes before the clock is read (every step reads its loss back).

    .venv/bin/python bench/gpu_throughput.py [--device cuda|cpu] [--steps N] [--pages N] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedsim_tasks.causal_lm import dpo_train, load_policy, load_tokenizer, prepare_base, sft_train
from fedsim_tasks.dialogue.trust_data import TrustExample
from fedsim_tasks.dialogue.trust_evaluator import TrustEvaluator
from fedsim_tasks.financebench_rag.inference import corpus_encoder
from fedsim_tasks.financebench_rag.train import train_encoder
from fedsim_tasks.hf import build_encoder
from fedsim_tasks.hh_preference.dataset import Example
from fedsim_tasks.hh_preference.selector import ScorerSelector

LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["query", "value"]}
WORDS = (
    "the company reported revenue growth in fiscal year with operating income margin cash flow "
    "assets debt customers stores region market share dividend quarter guidance net loss segment "
    "i love my dog and long walks in the park what do you like to cook on weekends sure"
).split()


def texts(n: int, words: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, words)) for _ in range(n)]


def timed(device: str, run, steps: int) -> float:
    """Seconds per call of ``run(steps)`` after one untimed call of ``run(1)``."""
    run(1)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    run(steps)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bench(device: str, steps: int, pages: int, threads: int) -> dict[str, dict]:
    torch.set_num_threads(threads)
    out = {}

    def record(name: str, seconds: float, count: int, unit: str) -> None:
        out[name] = {"rate": count / seconds, "unit": unit, "count": count, "seconds": seconds}
        if device == "cuda":
            out[name]["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        print(f"{name:16s} {device:5s} {count / seconds:10.2f} {unit}", flush=True)

    model = build_encoder("all-MiniLM-L6-v2", 128, LORA, seed=0, device=device)
    pairs = list(zip(texts(512, 12, 0), texts(512, 110, 1)))
    stats = {}  # the trainer's own clock: the steps, without building the trainer and the teacher
    timed(
        device,
        lambda n: stats.update(train_encoder(model, pairs, n, 16, 1e-4, 0.05, 1.0, seed=0)),
        steps,
    )
    record("retriever_train", stats["step-seconds"], steps, "steps/s")
    corpus = texts(pages, 110, 2)
    encode = corpus_encoder(model, "torch", threads)
    seconds = timed(device, lambda n: encode(corpus if n > 1 else corpus[:32]), 2)
    record("corpus_encode", seconds, pages, "encodings/s")

    ev = TrustEvaluator(
        "all-MiniLM-L6-v2", max_length=128, response_length=64, lora=LORA, seed=0, device=device
    )
    data = [
        TrustExample(c, r, float(i % 2), "x")
        for i, (c, r) in enumerate(zip(texts(256, 110, 3), texts(256, 50, 4)))
    ]
    record(
        "trust_train",
        timed(device, lambda n: ev.train(data, n, 16, 1e-4, seed=0), steps),
        steps,
        "steps/s",
    )

    selector = ScorerSelector(max_length=128, lora=LORA, seed=0, device=device)
    examples = [
        Example(i, "\n\nHuman: hi\n\nAssistant:", a, b, i % 2)
        for i, (a, b) in enumerate(zip(texts(256, 100, 5), texts(256, 100, 6)))
    ]
    seconds = timed(device, lambda n: selector.train(examples, n, 32, 1e-4, seed=0), steps)
    record("selector_train", seconds, steps, "steps/s")

    with tempfile.TemporaryDirectory() as tmp:
        base = prepare_base("all-MiniLM-L6-v2", Path(tmp) / "base", seed=0)
        policy, tokenizer = load_policy(base, LORA, seed=0, device=device), load_tokenizer(base)
        prompts, replies, other = texts(256, 80, 7), texts(256, 30, 8), texts(256, 30, 9)
        kwargs = dict(max_length=128, seed=0)
        seconds = timed(
            device,
            lambda n: sft_train(
                policy,
                tokenizer,
                list(zip(prompts, replies)),
                steps=n,
                batch_size=16,
                lr=1e-4,
                **kwargs,
            ),
            steps,
        )
        record("policy_sft", seconds, steps, "steps/s")
        seconds = timed(
            device,
            lambda n: dpo_train(
                policy,
                tokenizer,
                list(zip(prompts, replies, other)),
                steps=n,
                batch_size=8,
                lr=1e-4,
                beta=0.1,
                **kwargs,
            ),
            steps,
        )
        record("policy_dpo", seconds, steps, "steps/s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--steps", type=int, default=None, help="timed steps per step kind (cuda 20, cpu 3)"
    )
    parser.add_argument(
        "--pages", type=int, default=None, help="pages encoded (cuda 4096, cpu 128)"
    )
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch threads"
    )
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    steps, pages = args.steps or (20 if gpu else 3), args.pages or (4096 if gpu else 128)
    name = torch.cuda.get_device_name() if gpu else platform.processor() or platform.machine()
    print(
        f"device {args.device} ({name}), torch {torch.__version__}, {args.threads} threads, "
        f"{steps} steps, {pages} pages",
        flush=True,
    )
    figures = bench(args.device, steps, pages, args.threads)
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "device": args.device,
                    "name": name,
                    "torch": torch.__version__,
                    "threads": args.threads,
                    "figures": figures,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
