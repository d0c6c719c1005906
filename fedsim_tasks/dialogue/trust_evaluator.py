"""The trust evaluator: a BERT-family encoder whose BERTScore-style F1 between a context and a
response scores how trustworthy the response is (FedDTRE, METHODS.md section 2).

The score is written here (:func:`bertscore`) rather than taken from the ``bert-score`` package:
that package loads its model itself by hub name with a per-model layer table and scores without
gradients, while this evaluator is fine-tuned through the score and scores with its own weights.

Training: the F1 of each (context, response) goes through a learned calibration
``sigmoid(scale * (F - offset))`` into a binary cross-entropy against the label, so the encoder
learns token embeddings whose F1 is high for trustworthy and low for untrustworthy responses.
Adapters (LoRA) and the two calibration numbers are the trainable weights that travel.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score
from torch import nn
from transformers import AutoModel, AutoTokenizer

from fedsim.seeding import stream
from fedsim_tasks.causal_lm import index_batches
from fedsim_tasks.dialogue.trust_data import TrustExample
from fedsim_tasks.hf import (
    default_device,
    load_trainable,
    lora_config,
    resolve_model,
    trainable_arrays,
)
from fedsim_tasks.proximal import ProximalTerm

EVALUATOR_INIT = stream(
    "trust-evaluator-init"
)  # of the task's seed: the same evaluator on every client


def bertscore(
    x: torch.Tensor, x_mask: torch.Tensor, r: torch.Tensor, r_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Precision, recall and F1 per row between token embeddings of contexts ``x`` (B, Lx, H)
    and responses ``r`` (B, Lr, H), masks (B, L) marking the tokens that count: with cosine
    similarity x.r, R = mean over x of max_r x.r, P = mean over r of max_x x.r, F = 2PR/(P+R).
    A row without a token on either side (an empty generated reply), or whose P or R is not
    positive, scores 0: F1 is a harmonic mean of positives, and with opposite signs P + R near
    0 made it explode (-32.9 seen as a trust score, which set FedDTRE's alpha to 1)."""
    x_mask, r_mask = x_mask.bool(), r_mask.bool()
    sim = torch.bmm(F.normalize(x, dim=-1), F.normalize(r, dim=-1).transpose(1, 2))  # (B, Lx, Lr)
    low = torch.finfo(sim.dtype).min
    best_r = sim.masked_fill(~r_mask[:, None, :], low).max(dim=2).values  # per context token
    best_x = sim.masked_fill(~x_mask[:, :, None], low).max(dim=1).values  # per response token
    empty = ~(x_mask.any(1) & r_mask.any(1))
    recall = ((best_r * x_mask).sum(1) / x_mask.sum(1).clamp_min(1)).masked_fill(empty, 0.0)
    precision = ((best_x * r_mask).sum(1) / r_mask.sum(1).clamp_min(1)).masked_fill(empty, 0.0)
    positive = (precision > 0) & (recall > 0)
    f1 = torch.where(
        positive, 2 * precision * recall / torch.where(positive, precision + recall, 1.0), 0.0
    )
    return precision, recall, f1


class _Scorer(nn.Module):
    def __init__(self, encoder, scale: float, offset: float):
        super().__init__()
        self.encoder = encoder
        self.calibration = nn.Parameter(torch.tensor([scale, offset]))


class TrustEvaluator:
    def __init__(
        self,
        model: str = "all-MiniLM-L6-v2",
        max_length: int = 128,
        response_length: int = 64,
        lora: dict | None = None,
        seed: int = 0,
        scale: float = 10.0,
        offset: float = 0.5,
        device: str | None = None,
    ):
        path = resolve_model(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.max_length, self.response_length = max_length, response_length
        torch.manual_seed(EVALUATOR_INIT.seed(seed))
        encoder = AutoModel.from_pretrained(path)
        if lora:
            from peft import get_peft_model

            encoder = get_peft_model(encoder, lora_config(lora))
        self.device = default_device(device)
        self.net = _Scorer(encoder, scale, offset).to(self.device)
        self.net.eval()

    def weights(self) -> dict[str, np.ndarray]:
        return trainable_arrays(self.net)

    def load(self, weights: dict[str, np.ndarray]) -> None:
        load_trainable(self.net, weights)

    def _embed(
        self, texts: list[str], max_length: int, side: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Last-layer token embeddings and the mask of real (non-special, non-pad) tokens;
        contexts are cut from the left (their latest turns matter), responses from the right."""
        self.tokenizer.truncation_side = side
        enc = self.tokenizer(
            texts,
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
            return_special_tokens_mask=True,
        )
        mask = enc["attention_mask"].bool() & ~enc.pop("special_tokens_mask").bool()
        enc = {k: v.to(self.device) for k, v in enc.items()}
        return self.net.encoder(**enc).last_hidden_state, mask.to(self.device)

    def _f1(self, contexts: list[str], responses: list[str]) -> torch.Tensor:
        x, x_mask = self._embed(contexts, self.max_length, "left")
        r, r_mask = self._embed(responses, self.response_length, "right")
        return bertscore(x, x_mask, r, r_mask)[2]

    @torch.no_grad()
    def scores(self, contexts: list[str], responses: list[str], batch_size: int = 32) -> np.ndarray:
        """The trust score (F1) of each response to its context."""
        self.net.eval()
        return (
            np.concatenate(
                [
                    self._f1(contexts[i : i + batch_size], responses[i : i + batch_size])
                    .cpu()
                    .numpy()
                    for i in range(0, len(contexts), batch_size)
                ]
            )
            if contexts
            else np.zeros(0)
        )

    def train(
        self,
        examples: list[TrustExample],
        steps: int,
        batch_size: int,
        lr: float,
        seed: int,
        proximal_mu: float = 0.0,
    ) -> dict:
        """``steps`` AdamW steps of calibrated binary cross-entropy on the examples' labels, plus
        FedProx's term (:class:`~fedsim_tasks.proximal.ProximalTerm`); batches and dropout masks
        drawn from ``seed`` (not from the process's history)."""
        torch.manual_seed(seed)
        params = [p for p in self.net.parameters() if p.requires_grad]
        opt, proximal = (
            torch.optim.AdamW(params, lr=lr, weight_decay=0.0),
            ProximalTerm(self.net, proximal_mu),
        )
        self.net.train()
        losses = []
        for idx in index_batches(len(examples), batch_size, steps, seed):
            batch = [examples[i] for i in idx]
            f1 = self._f1([e.context for e in batch], [e.response for e in batch])
            scale, offset = self.net.calibration
            loss = F.binary_cross_entropy_with_logits(
                scale * (f1 - offset), torch.tensor([e.label for e in batch], device=self.device)
            )
            opt.zero_grad()
            proximal(loss).backward()
            opt.step()
            losses.append(float(loss.detach()))
        self.net.eval()
        return {
            "loss": losses[-1] if losses else float("nan"),
            "mean_loss": float(np.mean(losses)) if losses else float("nan"),
            "steps": steps,
        }

    def auc(self, examples: list[TrustExample]) -> dict:
        """ROC AUC of the trust score separating trustworthy (label >= 0.5) from untrustworthy
        responses, overall and against each untrustworthy kind."""
        s = self.scores([e.context for e in examples], [e.response for e in examples])
        good = np.array([e.label >= 0.5 for e in examples])
        kinds = np.array([e.kind for e in examples])
        out = {"auc": _auc(good, s), "examples": len(examples)}
        for kind in sorted(set(kinds[~good])):
            keep = good | (kinds == kind)
            out[f"auc_{kind}"] = _auc(good[keep], s[keep])
        out["mean_score_trusted"] = float(s[good].mean()) if good.any() else None
        out["mean_score_untrusted"] = float(s[~good].mean()) if (~good).any() else None
        return out


def _auc(positive: np.ndarray, scores: np.ndarray) -> float | None:
    return float(roc_auc_score(positive, scores)) if 0 < positive.sum() < len(positive) else None
