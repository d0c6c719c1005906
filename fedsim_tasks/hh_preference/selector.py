"""Binary preference selectors: which of two responses A, B to a prompt x is preferred.

:class:`ScorerSelector` (the offline default) scores each response Bradley-Terry style,
``s(x, y) = head(mean-pool(MiniLM("last Human turn [SEP] y")))``, and prefers B with probability
``sigmoid(s(x, B) - s(x, A))``: symmetric in A and B by construction, and both responses stay
whole in the encoder's input (OFFLINE_LMS.md: a cross-encoder over the truncated pair learned
nothing). The encoder carries LoRA adapters (peft) or, with ``frozen``, no trainable weights at
all: then embeddings are computed once per text and only the head trains (a linear
Bradley-Terry probe, the fast choice on a CPU).

:class:`CausalABSelector` is the paper's form: a causal LM reads x, A and B and its next-token
logits for " A" and " B" make the choice (Qwen-2-0.5B, Gemma-2B with LoRA; any Hugging Face
causal LM by name).

Both expose the trainable weights as a name-ordered dict of numpy arrays (what travels).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

from fedsim.seeding import stream
from fedsim_tasks.causal_lm import index_batches
from fedsim_tasks.hf import (
    build_encoder,
    default_device,
    load_trainable,
    lora_config,
    resolve_model,
    trainable_arrays,
)
from fedsim_tasks.hh_preference.dataset import ASSISTANT, HUMAN, Example
from fedsim_tasks.proximal import ProximalTerm

SELECTOR_INIT = stream("selector-init")  # of the task's seed: the same selector on every client


class _Base:
    """Training, loss and prediction over :class:`Example` lists; subclasses give logits."""

    module: nn.Module

    def logits(self, examples: list[Example]) -> torch.Tensor:
        """One logit per example: log-odds that B is preferred."""
        raise NotImplementedError

    def weights(self) -> OrderedDict[str, np.ndarray]:
        return trainable_arrays(self.module)

    def load(self, arrays: dict[str, np.ndarray]) -> None:
        load_trainable(self.module, arrays)

    def train(
        self,
        examples: list[Example],
        steps: int,
        batch_size: int,
        lr: float,
        seed: int,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        proximal_mu: float = 0.0,
    ) -> dict:
        """``steps`` AdamW steps (the paper's betas) of binary cross-entropy on seeded batches,
        cycling the data, plus FedProx's term (:class:`~fedsim_tasks.proximal.ProximalTerm`);
        dropout masks (a trained encoder) drawn from ``seed`` as well."""
        if not examples:
            raise ValueError("no training examples")
        torch.manual_seed(seed)
        params = [p for p in self.module.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)
        proximal, losses = ProximalTerm(self.module, proximal_mu), []
        self.module.train()
        for idx in index_batches(len(examples), batch_size, steps, seed):
            loss = self._bce([examples[i] for i in idx])
            opt.zero_grad()
            proximal(loss).backward()
            opt.step()
            losses.append(float(loss.detach()))
        self.module.eval()
        return {"steps": steps, "loss": float(np.mean(losses)) if losses else math.nan}

    def _bce(self, batch: list[Example]) -> torch.Tensor:
        logits = self.logits(batch)
        labels = torch.tensor([float(e.label) for e in batch], device=logits.device)
        return nn.functional.binary_cross_entropy_with_logits(logits, labels)

    @torch.no_grad()
    def prob_b(self, examples: list[Example], batch_size: int = 64) -> np.ndarray:
        self.module.eval()
        return (
            np.concatenate(
                [
                    torch.sigmoid(self.logits(examples[i : i + batch_size])).cpu().numpy()
                    for i in range(0, len(examples), batch_size)
                ]
            )
            if examples
            else np.zeros(0)
        )

    def loss(self, examples: list[Example]) -> float:
        """Mean binary cross-entropy (what clients report for regrouping)."""
        p = np.clip(self.prob_b(examples), 1e-7, 1 - 1e-7)
        y = np.array([e.label for e in examples], float)
        return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))

    def accuracy(self, examples: list[Example]) -> float:
        y = np.array([e.label for e in examples])
        return float(np.mean((self.prob_b(examples) > 0.5) == y))


def choices(
    selector: _Base, weights: list[dict[str, np.ndarray]], examples: list[Example]
) -> np.ndarray:
    """(U, N) 0/1: which response of each example every weight set of ``selector`` prefers (B = 1)."""
    out = []
    for w in weights:
        selector.load(w)
        out.append((selector.prob_b(examples) > 0.5).astype(int))
    return np.array(out)


def response_text(prompt: str, response: str, human_words: int) -> str:
    """What the scorer reads: the response, after the last ``human_words`` words of the last
    Human turn (0: the response alone), so the response is never the part truncated away."""
    if human_words <= 0:
        return response
    start = prompt.rfind(HUMAN) + len(HUMAN)
    human = prompt[start : len(prompt) - len(ASSISTANT)].split()[-human_words:]
    return f"{' '.join(human)} [SEP] {response}"


class ScorerSelector(_Base):
    """Bradley-Terry scorer over MiniLM (LoRA adapters, or ``frozen`` with cached embeddings),
    on ``device`` (default: the GPU where this process sees one)."""

    def __init__(
        self,
        model: str = "all-MiniLM-L6-v2",
        max_length: int = 128,
        lora: dict | None = None,
        frozen: bool = False,
        human_words: int = 0,
        seed: int = 0,
        device: str | None = None,
    ):
        if frozen and lora:
            raise ValueError("selector: frozen and lora exclude each other")
        self.encoder = build_encoder(model, max_length, lora, seed, device)
        if frozen:
            self.encoder.requires_grad_(False)
        self.frozen, self.human_words = frozen, human_words
        torch.manual_seed(SELECTOR_INIT.seed(seed))
        head = nn.Linear(self.encoder.get_embedding_dimension(), 1)
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        self.module = nn.ModuleDict({"encoder": self.encoder, "head": head}).to(self.encoder.device)
        self._cache: dict[str, torch.Tensor] = {}

    def _embed(self, texts: list[str]) -> torch.Tensor:
        if not self.frozen:
            from sentence_transformers.util import batch_to_device

            features = batch_to_device(self.encoder.tokenize(texts), self.encoder.device)
            return self.encoder(features)["sentence_embedding"]
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            vectors = self.encoder.encode(missing, batch_size=64, convert_to_tensor=True)
            self._cache.update(zip(missing, vectors))
        return torch.stack([self._cache[t] for t in texts])

    def scores(self, prompts: list[str], responses: list[str]) -> torch.Tensor:
        texts = [response_text(p, r, self.human_words) for p, r in zip(prompts, responses)]
        return self.module["head"](self._embed(texts)).squeeze(-1)

    def logits(self, examples: list[Example]) -> torch.Tensor:
        prompts = [e.prompt for e in examples]
        s = self.scores(prompts + prompts, [e.a for e in examples] + [e.b for e in examples])
        return s[len(examples) :] - s[: len(examples)]


class CausalABSelector(_Base):
    """The paper's selector: a causal LM asked which response is better, answering " A" or " B"
    (LoRA adapters on ``target_modules``); logit = l(" B") - l(" A") at the answer position."""

    TEMPLATE = "{prompt}\n\nResponse A: {a}\n\nResponse B: {b}\n\nWhich response is better? Answer:"

    def __init__(
        self,
        model: str,
        lora: dict | None = None,
        max_length: int = 512,
        seed: int = 0,
        device: str | None = None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model(model) if isinstance(model, str) else model
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch.manual_seed(SELECTOR_INIT.seed(seed))
        lm = AutoModelForCausalLM.from_pretrained(path)
        if lora:
            from peft import get_peft_model

            lm = get_peft_model(lm, lora_config(lora))
        else:
            lm.requires_grad_(False)  # nothing but adapters would train: say so by training nothing
        self.module, self.max_length = lm.to(default_device(device)), max_length
        self.answer_ids = [
            self.tokenizer.encode(t, add_special_tokens=False)[-1] for t in (" A", " B")
        ]

    def logits(self, examples: list[Example]) -> torch.Tensor:
        texts = [self.TEMPLATE.format(prompt=e.prompt.strip(), a=e.a, b=e.b) for e in examples]
        enc = self.tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
        ).to(self.module.device)
        out = self.module(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        last = (
            enc["attention_mask"].sum(1) - 1
            if self.tokenizer.padding_side == "right"
            else torch.full((len(examples),), enc["input_ids"].shape[1] - 1, device=out.device)
        )
        answer = out[torch.arange(len(examples), device=out.device), last]
        return answer[:, self.answer_ids[1]] - answer[:, self.answer_ids[0]]


class TfidfScorer:
    """Bradley-Terry over TF-IDF word uni- and bigrams: scikit-learn's logistic regression on the
    difference of the two responses' vectors without intercept, so symmetric in A and B as the
    MiniLM scorer is. Another model family than the selectors (lexical, no encoder): the judge
    that does not read the selectors' features, and the HH probe that says which labels are weak.
    A convex fit: steps cap the solver's iterations; it takes no batches, learning rate or seed."""

    def __init__(self, human_words: int = 32, c: float = 1.0, min_df: int = 1, seed: int = 0):
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        self.human_words = human_words
        self.vectorizer = TfidfVectorizer(ngram_range=(1, 2), min_df=min_df, sublinear_tf=True)
        self.model = LogisticRegression(C=c, fit_intercept=False)

    def _vectors(self, prompts: list[str], responses: list[str]):
        return self.vectorizer.transform(
            [response_text(p, r, self.human_words) for p, r in zip(prompts, responses)]
        )

    def _differences(self, examples: list[Example]):
        prompts = [e.prompt for e in examples]
        return self._vectors(prompts, [e.b for e in examples]) - self._vectors(
            prompts, [e.a for e in examples]
        )

    def train(self, examples: list[Example], steps: int, *_unused, **_unused_kw) -> dict:
        """Fit on ``examples`` (both orders of each pair); the selectors' call, the rest unused."""
        if not examples:
            raise ValueError("no training examples")
        texts = dict.fromkeys(
            response_text(e.prompt, r, self.human_words) for e in examples for r in (e.a, e.b)
        )
        self.vectorizer.fit(
            list(texts)
        )  # each text once: both orders of a pair hold it twice, min_df counts texts
        self.model.set_params(max_iter=steps)
        self.model.fit(self._differences(examples), [e.label for e in examples])
        return {"steps": int(self.model.n_iter_[0]), "features": len(self.vectorizer.vocabulary_)}

    def scores(self, prompts: list[str], responses: list[str]) -> torch.Tensor:
        return torch.as_tensor(
            self._vectors(prompts, responses) @ self.model.coef_[0], dtype=torch.float32
        )

    def margins(self, examples: list[Example]) -> np.ndarray:
        """s(B) - s(A) per example: the log-odds that B is preferred."""
        return self._differences(examples) @ self.model.coef_[0] if examples else np.zeros(0)

    def accuracy(self, examples: list[Example]) -> float:
        return float(np.mean((self.margins(examples) > 0) == np.array([e.label for e in examples])))
