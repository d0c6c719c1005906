"""Policy LM: causal BERT decoder, log-probs checked by hand, DPO, base saving, sampling.

Tiny models only: a 2-layer BERT encoder with the real MiniLM tokenizer (standing in for MiniLM)
and a 2-layer Llama with a byte-level BPE tokenizer trained here (the generic causal-LM path).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from fedsim_tasks.causal_lm import (
    dpo_loss,
    dpo_train,
    format_prompt,
    generate,
    load_policy,
    load_tokenizer,
    mean_token_nll,
    prepare_base,
    sequence_logprobs,
    sft_train,
    turn_separator,
)
from fedsim_tasks.hf import trainable_arrays

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}
TURNS = [("Human", "Hi there "), ("Assistant", "Hello."), ("Human", "How are you?")]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: thread hand-offs cost more than the arithmetic (5-15x slower on a busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    """A tiny BERT encoder without an LM head, saved like MiniLM."""
    path = tmp_path_factory.mktemp("encoder")
    tokenizer = load_tokenizer("all-MiniLM-L6-v2")
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A tiny Llama with a byte-level BPE tokenizer (keeps newlines, has <s> and </s>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = tmp_path_factory.mktemp("llama")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        ["Human: hello there, how are you today?\n\nAssistant: I am fine, thanks."] * 4,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>"
    ).save_pretrained(path)
    save_tiny_llama(path, load_tokenizer(path), max_positions=64)
    return path


def save_tiny_llama(path, tokenizer, max_positions: int, hidden_size: int = 32) -> None:
    """A 2-layer Llama over ``tokenizer``, seeded, saved to ``path``."""
    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    ).save_pretrained(path)


@pytest.fixture(scope="module")
def bases(encoder_dir, llama_dir, tmp_path_factory):
    return {
        "bert": prepare_base(str(encoder_dir), tmp_path_factory.mktemp("bases") / "bert", seed=0),
        "llama": prepare_base(str(llama_dir), tmp_path_factory.mktemp("unused") / "llama", seed=0),
    }


def test_tokenizers_and_prompt_format(bases):
    bert, llama = load_tokenizer(bases["bert"]), load_tokenizer(bases["llama"])
    assert (bert.bos_token, bert.eos_token, bert.pad_token, bert.padding_side) == (
        "[CLS]",
        "[SEP]",
        "[PAD]",
        "right",
    )
    assert (llama.bos_token, llama.eos_token, llama.pad_token) == ("<s>", "</s>", "</s>")
    prompt = format_prompt(TURNS, turn_separator(bert))
    assert (
        prompt
        == "Human: Hi there [SEP] Assistant: Hello. [SEP] Human: How are you? [SEP] Assistant:"
    )
    ids = bert(prompt, add_special_tokens=False)["input_ids"]
    assert (
        ids.count(bert.sep_token_id) == 3
        and bert.cls_token_id not in ids
        and ids[-1] != bert.sep_token_id
    )
    assert format_prompt(TURNS, turn_separator(llama)) == (
        "Human: Hi there\n\nAssistant: Hello.\n\nHuman: How are you?\n\nAssistant:"
    )


@pytest.mark.parametrize("lora", [None, LORA])
def test_bert_decoder_is_causal(bases, lora):
    model = load_policy(bases["bert"], lora, seed=0).eval()
    assert model.config.is_decoder
    ids = torch.tensor(
        [[101, 2529, 1024, 7632, 2045, 102, 3353, 1024]], device=model.device
    )  # CUDA where there is one
    changed = ids.clone()
    changed[0, 5] = 2000
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    torch.testing.assert_close(a[0, :5], b[0, :5])
    assert not torch.allclose(a[0, 5:], b[0, 5:])


def test_bidirectional_bert_is_refused(encoder_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(encoder_dir)
    with pytest.raises(ValueError, match="is_decoder"):
        sequence_logprobs(model, load_tokenizer(encoder_dir), ["Human: hi"], ["hello"], 16)


def _by_hand(model, ids: list[int], n_completion: int) -> torch.Tensor:
    """Sum over completion positions t of log_softmax(logits[t - 1])[ids[t]], one unpadded row."""
    logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0]
    return sum(
        torch.log_softmax(logits[t - 1], dim=-1)[ids[t]]
        for t in range(len(ids) - n_completion, len(ids))
    )


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_sequence_logprobs_by_hand(bases, arch):
    tokenizer, model = load_tokenizer(bases[arch]), load_policy(bases[arch], None, seed=0).eval()
    sep = turn_separator(tokenizer)
    long_prompt = format_prompt(
        [
            ("Human", "hello there how are you today"),
            ("Assistant", "i am fine"),
            ("Human", "how are you"),
        ],
        sep,
    )
    short_prompt = format_prompt([("Human", "hi")], sep)
    completions = ["i am fine thanks", f"fine{tokenizer.eos_token}"]
    max_length = 14

    def enc(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    bos, eos = [tokenizer.bos_token_id], tokenizer.eos_token_id
    first, second = enc(completions[0]) + [eos], enc("fine") + [eos]
    assert enc(completions[1]) == second  # the completion already ends with eos: counted once
    keep = max_length - 1 - len(first)
    assert 0 < keep < len(enc(long_prompt))  # the long prompt is cut from the left
    rows = [bos + enc(long_prompt)[-keep:] + first, bos + enc(short_prompt) + second]
    assert len(rows[0]) == max_length and len(rows[1]) < max_length  # the short row is padded
    with torch.no_grad():
        expected = torch.stack(
            [_by_hand(model, rows[0], len(first)), _by_hand(model, rows[1], len(second))]
        )
    got = sequence_logprobs(model, tokenizer, [long_prompt, short_prompt], completions, max_length)
    assert got.requires_grad
    torch.testing.assert_close(got.detach(), expected, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        plain = sequence_logprobs(model, tokenizer, [short_prompt], ["fine"], max_length)
    torch.testing.assert_close(plain, got.detach()[1:])


def test_dpo_loss_by_hand():
    loss, margin = dpo_loss(
        torch.tensor([-1.0, -2.0]),
        torch.tensor([-1.5, -1.0]),
        torch.tensor([-1.2, -2.0]),
        torch.tensor([-1.2, -1.2]),
        beta=0.5,
    )
    # margins: 0.5 * ((-1.0 + 1.2) - (-1.5 + 1.2)) = 0.25 and 0.5 * ((-2.0 + 2.0) - (-1.0 + 1.2)) = -0.1
    expected = (math.log1p(math.exp(-0.25)) + math.log1p(math.exp(0.1))) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert margin.item() == pytest.approx(0.075, abs=1e-6)


PAIRS = [
    (
        "Human: what is the capital of france [SEP] Assistant:",
        "paris is the capital",
        "i will not say",
    ),
    ("Human: how do i bake bread [SEP] Assistant:", "mix flour water and yeast", "i will not say"),
    ("Human: tell me a joke [SEP] Assistant:", "why did the chicken cross the road", "no"),
    ("Human: hello [SEP] Assistant:", "hello how can i help", "go away"),
]


def _margin(model, tokenizer) -> float:
    prompts = [p for p, _, _ in PAIRS]
    with torch.no_grad():
        chosen = sequence_logprobs(model, tokenizer, prompts, [c for _, c, _ in PAIRS], 32)
        rejected = sequence_logprobs(model, tokenizer, prompts, [r for _, _, r in PAIRS], 32)
    return float((chosen - rejected).mean())


def test_dpo_raises_the_margin_with_lora(bases):
    tokenizer = load_tokenizer(bases["bert"])
    kwargs = dict(batch_size=4, lr=1e-2, beta=0.5, max_length=32, seed=0)
    first = dpo_train(load_policy(bases["bert"], LORA, seed=0), tokenizer, PAIRS, steps=1, **kwargs)
    assert first["loss"] == pytest.approx(
        math.log(2), abs=1e-5
    )  # policy == reference before any update
    assert first["reward_margin"] == pytest.approx(0.0, abs=1e-5)

    model = load_policy(bases["bert"], LORA, seed=0)
    before = _margin(model, tokenizer)
    metrics = dpo_train(model, tokenizer, PAIRS, steps=8, **kwargs)
    after = _margin(model, tokenizer)
    assert after > before + 1.0 and metrics["reward_margin"] > 0 and metrics["loss"] < math.log(2)
    with model.disable_adapter():  # the base (the reference) is untouched
        assert _margin(model, tokenizer) == pytest.approx(before, abs=1e-5)

    again = load_policy(bases["bert"], LORA, seed=0)
    assert dpo_train(again, tokenizer, PAIRS, steps=8, **kwargs) == metrics
    assert _margin(again, tokenizer) == pytest.approx(after, abs=1e-6)


def test_full_finetuning_sft_and_dpo_on_llama(bases):
    tokenizer, model = load_tokenizer(bases["llama"]), load_policy(bases["llama"], None, seed=0)
    examples = [
        ("Human: hello there\n\nAssistant:", " I am fine, thanks."),
        ("Human: how are you?\n\nAssistant:", " Fine."),
    ]
    before = mean_token_nll(model, tokenizer, examples, max_length=32)
    metrics = sft_train(
        model, tokenizer, examples, steps=10, batch_size=2, lr=1e-2, max_length=32, seed=0
    )
    assert metrics["steps"] == 10 and metrics["loss"] < metrics["mean_loss"]
    assert mean_token_nll(model, tokenizer, examples, max_length=32) < before - 1.0
    pairs = [(p, c, " No.") for p, c in examples]
    dpo = dpo_train(
        model, tokenizer, pairs, steps=1, batch_size=2, lr=1e-3, beta=0.1, max_length=32, seed=0
    )
    assert dpo["loss"] == pytest.approx(
        math.log(2), abs=1e-5
    )  # the reference is the weights as passed


def test_prepare_base_saves_once(encoder_dir, llama_dir, tmp_path):
    base = prepare_base(str(encoder_dir), tmp_path / "base", seed=0)
    assert base == tmp_path / "base"
    stamps = {p.name: p.stat().st_mtime_ns for p in base.iterdir()}

    def head(model):
        return {k: v for k, v in model.state_dict().items() if k.startswith("cls.")}

    a, b = head(load_policy(base, None, seed=1)), head(load_policy(base, None, seed=2))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fresh1, fresh2 = (
        head(load_policy(encoder_dir, None, seed=1)),
        head(load_policy(encoder_dir, None, seed=2)),
    )
    key = "cls.predictions.transform.dense.weight"
    assert not torch.equal(fresh1[key], fresh2[key])  # unsaved, the head is redrawn on every load

    assert prepare_base(str(encoder_dir), base, seed=7) == base
    assert {p.name: p.stat().st_mtime_ns for p in base.iterdir()} == stamps
    assert [p.name for p in tmp_path.iterdir()] == ["base"]  # no temporary folder left behind
    assert load_tokenizer(base).eos_token == "[SEP]"
    assert prepare_base(str(llama_dir), tmp_path / "llama", seed=0) == str(llama_dir)
    assert not (tmp_path / "llama").exists()


@pytest.mark.parametrize("arch", ["bert", "llama"])
def test_generate_is_seeded(bases, arch):
    tokenizer, model = load_tokenizer(bases[arch]), load_policy(bases[arch], None, seed=0)
    sep = turn_separator(tokenizer)
    prompts = [format_prompt(TURNS, sep), format_prompt([("Human", "hi")], sep)]
    if arch == "bert":  # make [CLS] / [PAD] the likeliest tokens: they must still never be sampled
        with torch.no_grad():
            model.cls.predictions.decoder.bias[[tokenizer.cls_token_id, tokenizer.pad_token_id]] = (
                50.0
            )
            ids = tokenizer(prompts[0], return_tensors="pt")["input_ids"].to(model.device)
            assert model(input_ids=ids).logits[0, -1].argmax() in (
                tokenizer.cls_token_id,
                tokenizer.pad_token_id,
            )
    kwargs = dict(n=3, max_new_tokens=6, temperature=1.0, top_p=0.95)
    out = generate(model, tokenizer, prompts, seed=0, **kwargs)
    assert len(out) == 2 and all(
        len(replies) == 3 and all(isinstance(r, str) for r in replies) for replies in out
    )
    assert out == generate(model, tokenizer, prompts, seed=0, **kwargs)
    assert out != generate(model, tokenizer, prompts, seed=1, **kwargs)
    if arch == "bert":
        assert all(r.strip() for replies in out for r in replies)


@pytest.mark.parametrize("objective", ["sft", "dpo"])
def test_proximal_term_keeps_adapters_near_their_start(bases, objective):
    """FedProx: with a large mu the same SFT (or DPO) steps move the adapters far less."""
    tokenizer = load_tokenizer(bases["llama"])
    examples = [
        ("Human: hello there\n\nAssistant:", " I am fine, thanks."),
        ("Human: how are you?\n\nAssistant:", " Fine."),
    ]
    moved = {}
    for mu in (0.0, 100.0):
        model = load_policy(bases["llama"], {**LORA, "target_modules": None}, seed=0)
        start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        common = dict(steps=10, batch_size=2, lr=1e-2, max_length=32, seed=0, proximal_mu=mu)
        if objective == "sft":
            sft_train(model, tokenizer, examples, **common)
        else:
            dpo_train(model, tokenizer, PAIRS, beta=0.5, **common)
        moved[mu] = sum(
            float((p.detach() - start[n]).norm())
            for n, p in model.named_parameters()
            if p.requires_grad
        )
    assert 0 < moved[100.0] < 0.5 * moved[0.0]


def test_qlora_4bit_trains_adapters_on_a_tiny_llama(llama_dir, tmp_path):
    """QLoRA: the frozen base in 4-bit NF4 (bitsandbytes' CPU kernels), LoRA adapters in float.
    bitsandbytes' CPU kernel quantizes blocks of 64 inputs: the model is 64 wide."""
    pytest.importorskip("bitsandbytes")
    tokenizer = load_tokenizer(llama_dir)
    tokenizer.save_pretrained(tmp_path)
    save_tiny_llama(tmp_path, tokenizer, max_positions=64, hidden_size=64)
    lora = {**LORA, "target_modules": ["q_proj", "v_proj"]}
    model = load_policy(
        tmp_path, lora, seed=0, quantization="4bit", device="cpu"
    )  # CUDA: tests/test_gpu.py
    assert any("Linear4bit" in type(m).__name__ for m in model.modules())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    examples = [("Human: hello there\n\nAssistant:", " I am fine, thanks.")]
    sft_train(model, tokenizer, examples, steps=10, batch_size=1, lr=1e-2, max_length=32, seed=0)
    fresh = load_policy(tmp_path, lora, seed=0, quantization="4bit", device="cpu")
    assert (
        mean_token_nll(model, tokenizer, examples, 32)
        < mean_token_nll(fresh, tokenizer, examples, 32) - 0.1
    )
    # bitsandbytes' CPU kernels may repack the base at the first inference call (on this 2-core
    # machine they do; on the H100 machine's CPU they did not): training after it reaches no
    # adapter, and is then refused instead of silently changing nothing
    start = trainable_arrays(fresh)
    try:
        sft_train(fresh, tokenizer, examples, steps=1, batch_size=1, lr=1e-2, max_length=32, seed=0)
    except RuntimeError as exc:
        assert "no gradient" in str(exc)
    else:
        assert any(not np.array_equal(start[k], v) for k, v in trainable_arrays(fresh).items())
    with pytest.raises(ValueError, match="quantization"):
        load_policy(tmp_path, LORA, seed=0, quantization="3bit")


class _Loaded(Exception):
    """Stops load_policy right after from_pretrained, carrying its keyword arguments."""


@pytest.mark.parametrize(
    "device,quantization,device_map",
    [
        (None, None, {"": 0}),  # a GPU client: the model on its GPU
        ("cpu", None, None),  # asked for the CPU: loaded there (no device map)
        (
            "cpu",
            "4bit",
            {"": "cpu"},
        ),  # quantized: transformers would otherwise put it on the GPU (seen on an H100)
        ("cuda:1", "4bit", {"": 1}),
    ],
)
def test_load_policy_places_the_model_where_asked_on_a_gpu_machine(
    bases, monkeypatch, device, quantization, device_map
):
    """Where the model goes on a machine with a GPU (CUDA mocked; tests/test_gpu.py runs it for real)."""
    from transformers import AutoModelForCausalLM

    def loaded(path, **kwargs):
        raise _Loaded(kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", loaded)
    monkeypatch.setattr("fedsim_tasks.causal_lm._bnb_config", lambda q: "bnb")
    with pytest.raises(_Loaded) as got:
        load_policy(bases["llama"], None, seed=0, quantization=quantization, device=device)
    assert got.value.args[0].get("device_map") == device_map
