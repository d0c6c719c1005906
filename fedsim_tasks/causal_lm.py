"""A causal language model for dialogue: loading (LoRA / QLoRA), SFT, DPO, sampling, a saved
SFT'd base. FedBis / FedBiscuit's policy (METHODS.md section 4) and FedDTRE's generator (section 2).

The DPO loss is written here on purpose: trl 1.16 silently computes wrong log-probs for the
offline BERT decoder (OFFLINE_LMS.md).

Offline, the model is the warm-started MiniLM decoder (``is_decoder=True``, else BERT attends
both ways). Its head transform is not in MiniLM and is random on every load, so
:func:`prepare_base` initialises it once and saves the base every client and adapter share. Any
other Hugging Face causal LM name is used as is.

Text format. A dialogue is a list of turns ``("Human", text)`` / ``("Assistant", text)``;
:func:`format_prompt` writes ``"Human: ...<sep>Assistant: ...<sep>Human: ...<sep>Assistant:"``
so the model continues with the reply, and the reply ends with the eos token. WordPiece drops
newlines, so BERT tokenizers separate turns with ``" [SEP] "`` (their eos, which then also marks
the end of a turn); other tokenizers with HH's own ``"\\n\\n"`` (:func:`turn_separator`). Prompts
and completions are tokenized apart, without special tokens, and joined as
``bos + prompt + completion + eos``: a completion is scored exactly as :func:`generate` produced
it. (Byte-level BPE tokenizers keep spaces: give a reference reply its leading space, " Sure.".)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from fedsim import progress
from fedsim.seeding import stream
from fedsim_tasks.dp_sgd import (
    DP_EPSILON,
    DP_EPSILON_PLD,
    DP_EPSILON_RDP,
    DPSGD,
    GradientCanaries,
    PrivateSteps,
)
from fedsim_tasks.hf import default_device, lora_config, resolve_model
from fedsim_tasks.proximal import ProximalTerm

BERT_HEAD = "cls.predictions.transform"
SFT_RECORD = "fedsim_sft.json"  # how a saved base was made, beside its weights
SFT_VERSION = (
    3  # part of a saved base's key: raised when sft_train gives other weights for the same inputs
)
# of the seed they are given: the same on every client
BASE_HEAD_INIT, POLICY_INIT, BASE_SFT = (
    stream("base-head-init"),
    stream("policy-init"),
    stream("base-sft"),
)
log = logging.getLogger("fedsim")


def _is_bert(config) -> bool:
    return config.model_type == "bert"


def load_tokenizer(path: str | Path):
    """The model's tokenizer; a BERT tokenizer has no bos/eos, so [CLS] starts and [SEP] ends a
    sequence. Padding goes right (positions stay those of the unpadded text)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(str(path)))
    if tokenizer.eos_token is None and tokenizer.sep_token and tokenizer.cls_token:
        tokenizer.bos_token, tokenizer.eos_token = tokenizer.cls_token, tokenizer.sep_token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def prepare_base(model_name: str, save_dir: str | Path, seed: int) -> Path | str:
    """The policy base to load: for a BERT model, the decoder with its random head transform
    drawn once (seeded) and saved to ``save_dir``, so every client and adapter share one base;
    the name unchanged for any other causal LM. The save goes to a temporary folder renamed into
    place, so a half-written base is never loaded and concurrent callers keep the first one."""
    path = resolve_model(model_name)
    if not _is_bert(AutoConfig.from_pretrained(path)):
        return model_name
    save_dir = Path(save_dir)
    if (save_dir / "config.json").exists():
        return save_dir
    save_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{save_dir.name}.", dir=save_dir.parent))
    try:
        torch.manual_seed(BASE_HEAD_INIT.seed(seed))
        AutoModelForCausalLM.from_pretrained(path, is_decoder=True).save_pretrained(tmp)
        load_tokenizer(path).save_pretrained(tmp)
        try:
            tmp.rename(save_dir)
        except OSError:
            if not (save_dir / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return save_dir


def load_policy(
    path: str | Path,
    lora: dict | None = None,
    seed: int = 0,
    quantization: str | None = None,
    device: str | None = None,
):
    """The causal LM (a BERT base as a causal decoder) with optional LoRA adapters (keys r,
    alpha, dropout, target_modules: peft's per-architecture default when absent). On BERT the
    head transform trains too (``modules_to_save``): LoRA on attention cannot fix a random
    head. Adapter init is seeded so every client starts from the same weights. The model lives
    on ``device`` (default: the GPU where this process sees one, as a GPU client of
    ``hardware=gpu_1`` does).

    ``quantization`` "4bit" (NF4, QLoRA) or "8bit" loads the frozen base through bitsandbytes
    (GPU; bitsandbytes 0.50 also runs it on CPU, slowly) and prepares it for adapter training."""
    path = resolve_model(str(path))
    bert = _is_bert(AutoConfig.from_pretrained(path))
    torch.manual_seed(POLICY_INIT.seed(seed))
    kwargs = {"is_decoder": True} if bert else {}
    if quantization:
        kwargs["quantization_config"] = _bnb_config(quantization)
    device = torch.device(default_device(device))
    if device.type == "cuda":
        kwargs["device_map"] = {
            "": device.index if device.index is not None else torch.cuda.current_device()
        }
    elif quantization:  # else transformers puts a quantized model on the GPU wherever it sees one
        kwargs["device_map"] = {"": "cpu"}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)  # no device_map: on the CPU
    if quantization:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if lora:
        from peft import TaskType, get_peft_model

        model = get_peft_model(
            model,
            lora_config(
                lora, task_type=TaskType.CAUSAL_LM, modules_to_save=[BERT_HEAD] if bert else None
            ),
        )
    return model


def shared_policy(path: str, lora_json: str, seed: int, quantization: str | None = None):
    """The policy with adapters and its tokenizer, loaded once per process: a Ray actor serves
    many clients, and each message loads its own adapter weights into this one model. A
    quantized base is loaded fresh each time: bitsandbytes 0.50's CPU kernels repack the weights
    at the first inference call, after which no gradient reaches the adapters."""
    if quantization:
        return load_policy(path, json.loads(lora_json), seed, quantization), load_tokenizer(path)
    return _cached_policy(path, lora_json, seed)


@lru_cache(maxsize=1)
def _cached_policy(path: str, lora_json: str, seed: int):
    return load_policy(path, json.loads(lora_json), seed), load_tokenizer(path)


def _bnb_config(quantization: str):
    from transformers import BitsAndBytesConfig

    if quantization == "4bit":
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.float32,
        )
    if quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"quantization must be null, '4bit' or '8bit', got {quantization!r}")


def turn_separator(tokenizer) -> str:
    """``" [SEP] "`` for tokenizers whose separator is their eos (BERT: newlines are lost),
    HH's ``"\\n\\n"`` otherwise."""
    sep = tokenizer.sep_token
    return f" {sep} " if sep and sep == tokenizer.eos_token else "\n\n"


def format_prompt(turns: list[tuple[str, str]], sep: str = "\n\n") -> str:
    """The dialogue as text ending with ``"Assistant:"``, the cue for the model's reply."""
    return "".join(f"{role}: {text.strip()}{sep}" for role, text in turns) + "Assistant:"


def _check_causal(model) -> None:
    if _is_bert(model.config) and not model.config.is_decoder:
        raise ValueError(
            "BERT without is_decoder=True attends to later tokens: load it with load_policy"
        )


def _encode(tokenizer, prompts: list[str], completions: list[str], max_length: int):
    """Right-padded ``bos + prompt + completion + eos`` ids, attention mask and completion mask.
    eos is appended unless the completion already ends with it; the prompt is cut from the left
    when the whole exceeds ``max_length`` (the completion from the right only if it alone does)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    eos = tokenizer.eos_token_id
    p_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    c_ids = tokenizer(completions, add_special_tokens=False)["input_ids"]
    rows = []
    for p, c in zip(p_ids, c_ids):
        c = (c if c and c[-1] == eos else c + [eos])[: max(max_length - len(bos) - 1, 1)]
        keep = max(max_length - len(bos) - len(c), 0)
        rows.append((bos + p[max(len(p) - keep, 0) :], c))
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    scored = torch.zeros_like(ids, dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        attention[i, : len(p) + len(c)] = 1
        scored[i, len(p) : len(p) + len(c)] = True
    return ids, attention, scored


def _completion_logprobs(
    model, tokenizer, prompts, completions, max_length, per_example: bool = False
):
    """Per-sequence sum of completion-token log-probs and the number of tokens summed. The LM
    head runs only at the positions that predict a completion token (``logits_to_keep``): for a
    small model over a 30k vocabulary it is half the compute, and the prompt needs none.
    ``per_example``: the head runs everywhere and the positions are picked after it, so every
    layer sees whole sequences (DP-SGD's per-example gradients need the batch dimension)."""
    _check_causal(model)
    device = next(model.parameters()).device
    ids, attention, scored = (
        t.to(device) for t in _encode(tokenizer, prompts, completions, max_length)
    )
    keep = torch.zeros_like(scored)
    keep[:, :-1] = scored[
        :, 1:
    ]  # position t predicts token t + 1: logits only where that is scored
    if per_example:
        logits = (
            model(input_ids=ids, attention_mask=attention).logits[keep].float()
        )  # (kept, vocab)
    else:
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep).logits.float()
    targets = ids[:, 1:][scored[:, 1:]]
    token_logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    rows = keep.nonzero()[:, 0]  # the boolean selection is row-major, as nonzero
    return torch.zeros(len(ids), device=device).index_add(0, rows, token_logp), keep.sum(-1)


def sequence_logprobs(
    model, tokenizer, prompts: list[str], completions: list[str], max_length: int
) -> torch.Tensor:
    """log p(completion + eos | prompt) per pair, differentiable (the DPO and SFT objective)."""
    return _completion_logprobs(model, tokenizer, prompts, completions, max_length)[0]


def dpo_loss(
    pi_chosen: torch.Tensor,
    pi_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DPO: ``-log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))``, averaged, and the mean
    implicit reward margin ``beta * (...)`` (chosen minus rejected reward; detached)."""
    margin = beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))
    return -F.logsigmoid(margin).mean(), margin.detach().mean()


def index_batches(n: int, batch_size: int, steps: int, seed: int):
    """``steps`` index batches from seeded permutations, cycling through the data."""
    if n == 0:
        raise ValueError("no training examples")
    rng = np.random.default_rng(seed)
    order, at = rng.permutation(n), 0
    for _ in range(steps):
        if at + batch_size > n:
            order, at = rng.permutation(n), 0
        yield order[at : at + batch_size].tolist()
        at += batch_size


def _progress(what: str, step: int, steps: int, loss: float, start: float) -> None:
    """A line every tenth of a long run (>= 50 steps), so a user sees it move."""
    if steps >= 50 and step % (steps // 10) == 0:
        log.info(
            "%s",
            progress.line(
                what, step, steps, time.perf_counter() - start, "steps", f"loss {loss:.3f}"
            ),
        )


def _optimizer(model, lr: float):
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0
    )


@torch.no_grad()
def _reference_logprobs(
    model, tokenizer, prompts, completions, max_length, batch_size
) -> torch.Tensor:
    """Reference log-probs, once per call: the base under the LoRA adapters (peft's
    ``disable_adapter``), or the weights as passed for full fine-tuning (they are the frozen copy,
    since nothing has been updated yet)."""
    model.eval()

    def run():
        return torch.cat(
            [
                sequence_logprobs(
                    model,
                    tokenizer,
                    prompts[i : i + batch_size],
                    completions[i : i + batch_size],
                    max_length,
                )
                for i in range(0, len(prompts), batch_size)
            ]
        )

    from peft import PeftModel

    if isinstance(model, PeftModel):
        with model.disable_adapter():
            return run()
    return run()


def dpo_train(
    model,
    tokenizer,
    pairs: list[tuple[str, str, str]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    beta: float,
    max_length: int,
    seed: int,
    proximal_mu: float = 0.0,
    after_step: Callable[[int], None] | None = None,
) -> dict:
    """``steps`` AdamW steps of DPO on (prompt, chosen, rejected) pairs, plus FedProx's term
    (:class:`~fedsim_tasks.proximal.ProximalTerm`, ``proximal_mu``). Dropout stays off (as
    trl's default) so that policy and reference agree exactly before the first update.
    ``after_step(step)`` runs after each update (a training curve scores the policy there:
    one run, one optimizer and one reference, not a restart per point)."""
    if not pairs:
        raise ValueError("no preference pairs")
    if steps <= 0:
        return {"loss": float("nan"), "reward_margin": float("nan"), "steps": 0}
    prompts, chosen, rejected = (list(x) for x in zip(*pairs))
    batches = list(index_batches(len(pairs), batch_size, steps, seed))
    used = sorted(
        {i for idx in batches for i in idx}
    )  # reference log-probs of the pairs trained on only
    ref = _reference_logprobs(
        model,
        tokenizer,
        [prompts[i] for i in used] * 2,
        [chosen[i] for i in used] + [rejected[i] for i in used],
        max_length,
        batch_size,
    )
    ref_chosen = torch.full(
        (len(pairs),), float("nan"), device=ref.device
    )  # where the policy's log-probs are
    ref_rejected = torch.full((len(pairs),), float("nan"), device=ref.device)
    ref_chosen[used], ref_rejected[used] = ref[: len(used)], ref[len(used) :]
    opt, proximal = _optimizer(model, lr), ProximalTerm(model, proximal_mu)
    model.eval()
    loss = margin = torch.tensor(float("nan"))
    start = time.perf_counter()
    for step, idx in enumerate(batches, 1):
        batch_prompts = [prompts[i] for i in idx]
        pi = sequence_logprobs(
            model,
            tokenizer,
            batch_prompts + batch_prompts,
            [chosen[i] for i in idx] + [rejected[i] for i in idx],
            max_length,
        )
        loss, margin = dpo_loss(
            pi[: len(idx)], pi[len(idx) :], ref_chosen[idx], ref_rejected[idx], beta
        )
        opt.zero_grad()
        proximal(loss).backward()
        opt.step()
        _progress("dpo", step, steps, float(loss.detach()), start)
        if after_step is not None:
            after_step(step)
    return {"loss": float(loss.detach()), "reward_margin": float(margin), "steps": steps}


def sft_train(
    model,
    tokenizer,
    examples: list[tuple[str, str]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    max_length: int,
    seed: int,
    proximal_mu: float = 0.0,
    dp: DPSGD | None = None,
    **dp_state,
) -> dict:
    """``steps`` AdamW steps of SFT: the completion's negative log-likelihood per token given
    the prompt, plus FedProx's term (:class:`~fedsim_tasks.proximal.ProximalTerm`, ``proximal_mu``;
    its anchor the weights this call starts from). Dropout masks are
    drawn from ``seed`` too: torch's global generator otherwise holds whatever the process did
    before (a Ray actor serves many clients, in the order the scheduler gives). ``dp`` enabled:
    the steps are DP-SGD's (:func:`private_sft`; ``dp_state``: its horizon)."""
    if dp is not None and dp.enabled:
        if proximal_mu > 0:
            raise ValueError(
                "dp_sgd with FedProx: the proximal term's gradient is not per record "
                "and would escape the clipping; use one or the other"
            )
        return private_sft(
            model,
            tokenizer,
            examples,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            max_length=max_length,
            dp=dp,
            **dp_state,
        )
    torch.manual_seed(seed)
    opt, proximal = _optimizer(model, lr), ProximalTerm(model, proximal_mu)
    trainable = [p for p in model.parameters() if p.requires_grad]
    model.train()
    losses, start = [], time.perf_counter()
    for step, idx in enumerate(index_batches(len(examples), batch_size, steps, seed), 1):
        logp, count = _completion_logprobs(
            model,
            tokenizer,
            [examples[i][0] for i in idx],
            [examples[i][1] for i in idx],
            max_length,
        )
        loss = -logp.sum() / count.sum()
        losses.append(float(loss.detach()))
        opt.zero_grad()
        proximal(loss).backward()
        if step == 1:
            _check_gradients(trainable)
        opt.step()
        _progress("sft", step, steps, losses[-1], start)
    model.eval()
    return {
        "loss": losses[-1] if losses else float("nan"),
        "mean_loss": float(np.mean(losses)) if losses else float("nan"),
        "steps": steps,
    }


def private_sft(
    model,
    tokenizer,
    examples: list[tuple[str, str]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    max_length: int,
    dp: DPSGD,
    horizon_steps: int = 0,
    noise_seed: int | None = None,
    canaries: GradientCanaries | None = None,
) -> dict:
    """SFT under DP-SGD (``fedsim_tasks/dp_sgd.py``): Poisson batches of expected size ``batch_size``
    drawn from the client's own randomness (not the run's seed: the server would know them),
    each record's loss its own mean token nll (so its gradient depends on it alone), clipped
    and noised. The stats add this call's epsilon and its steps (a client composes its trainings
    with a ``StepsLedger``). ``canaries``: an audit's (``fedsim/privacy/audit.py``), sampled beside the records."""
    private = PrivateSteps(
        dp,
        model,
        _optimizer(model, lr),
        len(examples),
        batch_size,
        horizon_steps or steps,
        noise_seed,
        canaries,
    )
    model.train()
    losses, start = [], time.perf_counter()
    try:
        for step, idx in enumerate(private.batches(steps), 1):
            loss = None
            if idx:
                logp, count = _completion_logprobs(
                    model,
                    tokenizer,
                    [examples[i][0] for i in idx],
                    [examples[i][1] for i in idx],
                    max_length,
                    per_example=True,
                )
                per_record = -logp / count.clamp(min=1)
                losses.append(float(per_record.mean().detach()))
                loss = per_record.mean()
            private.step(loss)
            _progress("dp-sft", step, steps, losses[-1] if losses else float("nan"), start)
    finally:
        private.close()
        model.eval()
    spent = private.epsilon()
    return {
        "loss": losses[-1] if losses else float("nan"),
        "mean_loss": float(np.mean(losses)) if losses else float("nan"),
        "steps": steps,
        DP_EPSILON: spent.reported,
        DP_EPSILON_RDP: spent.rdp,
        DP_EPSILON_PLD: spent.pld,
        "dp-noise-multiplier": private.sigma,
        "dp-steps": private.steps,
    }


def _check_gradients(trainable: list) -> None:
    """Refuse to train when no gradient reaches the trainable weights (e.g. a quantized kernel
    without backward): the steps would silently change nothing."""
    if not any(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in trainable):
        raise RuntimeError(
            "no gradient reaches the trainable weights: training would change nothing "
            "(a quantized base after an inference call on CPU? load it fresh)"
        )


def saved_sft_base(
    model_name: str,
    base_dir: str,
    key: dict,
    data: Callable[[str], tuple[list, list, dict]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    max_length: int,
    seed: int,
) -> tuple[Path, dict]:
    """A base taught to answer by full-fine-tuning SFT, built once per ``key`` (its hash names
    the folder under ``base_dir``) and reused by every later run, client and adapter.

    ``steps`` 0 uses the model as published. ``data(separator)`` gives (train, held_out,
    description) examples; the record of how the
    base was made (data, held-out nll before and after) is saved beside its weights, and the
    folder is written under a temporary name and renamed into place: a half-written base (or one
    without its record) is never used."""
    root = Path(os.path.expanduser(base_dir))
    if steps == 0:  # a model that answers already (a chat LM): used as published
        return prepare_base(model_name, root / "init", seed), {"data": "none (no SFT)", "steps": 0}
    digest = hashlib.sha256(
        json.dumps({**key, "sft_version": SFT_VERSION}, sort_keys=True).encode()
    ).hexdigest()[:12]
    done = root / f"sft-{digest}"
    if (done / SFT_RECORD).exists():
        return done, json.loads((done / SFT_RECORD).read_text())
    init = prepare_base(model_name, root / "init", seed)
    model, tokenizer = load_policy(init), load_tokenizer(init)
    train, held_out, description = data(turn_separator(tokenizer))
    before = mean_token_nll(model, tokenizer, held_out, max_length)
    log.info(
        "base model: SFT %d steps on %d examples (once; saved under %s)", steps, len(train), root
    )
    start = time.perf_counter()
    stats = sft_train(
        model,
        tokenizer,
        train,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        max_length=max_length,
        seed=BASE_SFT.seed(seed),
    )
    result = {
        **description,
        "examples": len(train),
        "heldout_nll_before": before,
        "heldout_nll": mean_token_nll(model, tokenizer, held_out, max_length),
        "seconds": time.perf_counter() - start,
        **stats,
    }
    tmp = root / f".sft-{digest}.{os.getpid()}"
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / SFT_RECORD).write_text(json.dumps(result))
    tmp.rename(done)
    log.info("base model SFT: held-out nll %.3f -> %.3f", before, result["heldout_nll"])
    return done, result


@torch.no_grad()
def mean_token_nll(
    model, tokenizer, examples: list[tuple[str, str]], max_length: int, batch_size: int = 16
) -> float:
    """Held-out negative log-likelihood per completion token (eos included)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i : i + batch_size]
        logp, n = _completion_logprobs(
            model, tokenizer, [p for p, _ in chunk], [c for _, c in chunk], max_length
        )
        total, count = total - float(logp.sum()), count + int(n.sum())
    return total / count if count else float("nan")


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[str],
    *,
    n: int = 1,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[list[str]]:
    """``n`` sampled completions per prompt (``temperature`` 0: the greedy one), without the
    prompt, cut at eos; seeded. Each prompt runs on its own (no padding, so BERT's absolute
    positions stay right), left-truncated to leave room for the reply; special tokens other
    than eos ([CLS], [PAD], ...) are never produced."""
    _check_causal(model)
    model.eval()
    device = next(model.parameters()).device
    bos = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    eos = tokenizer.eos_token_id
    room = model.config.max_position_embeddings - max_new_tokens - len(bos)
    suppress = [i for i in tokenizer.all_special_ids if i != eos]
    torch.manual_seed(seed)
    out, start = [], time.perf_counter()
    for k, ids in enumerate(tokenizer(prompts, add_special_tokens=False)["input_ids"]):
        if k and k % 25 == 0:
            log.info(
                "[generate] %d/%d prompts x %d samples, %.0f s",
                k,
                len(prompts),
                n,
                time.perf_counter() - start,
            )
        inputs = torch.tensor([bos + ids[max(len(ids) - room, 0) :]], device=device)
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_p": top_p}
            if temperature > 0
            else {"do_sample": False}
        )
        seqs = model.generate(
            input_ids=inputs,
            attention_mask=torch.ones_like(inputs),
            **sampling,
            max_new_tokens=max_new_tokens,
            num_return_sequences=n,
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id,
            suppress_tokens=suppress,
        )
        replies = [s[inputs.shape[1] :].tolist() for s in seqs]
        out.append(
            [
                tokenizer.decode(r[: r.index(eos)] if eos in r else r, skip_special_tokens=True)
                for r in replies
            ]
        )
    return out
