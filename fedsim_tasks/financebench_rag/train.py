"""Local objective of FedE4RAG: InfoNCE with in-batch negatives plus KD-GLE (plus FedProx's
proximal term under ``strategy=fedprox``: ``fedsim_tasks/proximal.py``).

KD-GLE is the mean squared difference between the local model's query-chunk cosine
similarities and those of the frozen global model on the same batch (all pairs of the batch).
InfoNCE is sentence-transformers' MultipleNegativesRankingLoss with scale = 1 / temperature;
the loop is sentence-transformers' trainer.

The student trains without dropout unless asked (``dropout=True``): the teacher runs in eval
mode, and a student with dropout would differ from it by the dropout masks alone, so the KD
term would not be zero when the two models agree.
"""

from __future__ import annotations

import copy
import gc
import logging
import tempfile
import time
from contextlib import contextmanager

import torch
from torch import nn
from transformers import TrainerCallback

from fedsim_tasks.proximal import ProximalTerm

log = logging.getLogger("fedsim")


class KDInfoNCELoss(nn.Module):
    """InfoNCE(q, p) + kd_weight * mean((sim_local - sim_global)^2) over the batch's q x p
    (+ the proximal term, where given).

    At step ``ratio_step`` (0-based; the trainer's last step where ``train_encoder`` builds it)
    the loss also records ``kd-grad-ratio``: the norm of the weighted KD term's gradient over
    InfoNCE's, on the trainable weights. Whether KD acts is that ratio, not the terms' values
    (a KD term of 1e-3 can pull hard at KD x100, and a large one little if it is flat)."""

    def __init__(
        self,
        model,
        temperature: float,
        kd_weight: float,
        teacher=None,
        proximal: ProximalTerm | None = None,
        ratio_step: int | None = None,
    ):
        super().__init__()
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
        from sentence_transformers.util import cos_sim

        self.model = model
        self.infonce = MultipleNegativesRankingLoss(model, scale=1.0 / temperature)
        self.cos_sim = cos_sim
        self.kd_weight = kd_weight
        self.teacher, self.proximal = teacher, proximal
        if kd_weight and teacher is None:
            raise ValueError("KD needs the frozen global model (teacher)")
        self.ratio_step = ratio_step
        self.last = {}
        self.history: list[dict] = []  # every step's terms, for the means a client reports
        self.grad_ratio: float | None = None

    def forward(self, sentence_features, labels=None):
        features = list(sentence_features)
        embeddings = [self.model(f)["sentence_embedding"] for f in features]
        loss = self.infonce.compute_loss_from_embeddings(embeddings, labels)
        self.last = {"infonce": float(loss.detach())}
        if self.kd_weight:
            kd = self.kd_term(embeddings, features)
            self.last["kd"] = float(kd.detach())
            if len(self.history) == self.ratio_step:
                self.grad_ratio = self._grad_norm(self.kd_weight * kd) / max(
                    self._grad_norm(loss), 1e-30
                )
            loss = loss + self.kd_weight * kd
        self.history.append(self.last)
        return self.proximal(loss) if self.proximal else loss

    def _grad_norm(self, term: torch.Tensor) -> float:
        """L2 norm of ``term``'s gradient over the trainable weights (the graph is kept for the
        step's own backward pass)."""
        weights = [p for p in self.model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(term, weights, retain_graph=True, allow_unused=True)
        return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads if g is not None)))

    def kd_term(self, embeddings, features) -> torch.Tensor:
        with torch.no_grad():
            q, p = (self.teacher(dict(f))["sentence_embedding"] for f in features[:2])
            teacher_sim = self.cos_sim(q, p)
        return torch.mean((self.cos_sim(embeddings[0], embeddings[1]) - teacher_sim) ** 2)


class StepClock(TrainerCallback):
    """Splits a training call into set-up (teacher, dataset, trainer, optimizer) and the steps
    (batches, forward, backward, update), so the cost of a ClientApp can be broken down."""

    def __init__(self):
        self.start = self.begin = self.end = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.end = time.perf_counter()


@contextmanager
def collect_only_new_objects():
    """The trainer calls ``gc.collect()`` on entry (accelerate's ``free_memory``, meant for GPU
    memory). A full collection rescans every object the process holds, ~0.7M once torch,
    transformers, datasets (and in a Ray actor Ray and Flower) are imported: 0.3-0.9 s per
    training call here. Freezing what exists leaves it the objects the call makes; unfreezing
    afterwards hands everything back to the normal collections (nothing stays frozen), unless
    the process had frozen its heap before (a warm ClientApp's fork, ``fedsim/run/superexec.py``:
    unfreezing would hand the preloaded libraries' objects back to every later collection)."""
    frozen_before = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        yield
    finally:
        if not frozen_before:
            gc.unfreeze()


@contextmanager
def without_dropout(model, off: bool = True):
    """Sets every dropout probability of ``model`` to 0 inside the block (the trainer switches
    the model to train mode, which would turn dropout on), and restores them after."""
    layers = [m for m in model.modules() if isinstance(m, nn.Dropout)] if off else []
    kept = [m.p for m in layers]
    for m in layers:
        m.p = 0.0
    try:
        yield
    finally:
        for m, p in zip(layers, kept):
            m.p = p


def frozen_copy(model):
    teacher = copy.deepcopy(model)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    return teacher


def train_encoder(
    model,
    pairs: list[tuple[str, str]],
    steps: int,
    batch_size: int,
    lr: float,
    temperature: float,
    kd_weight: float,
    seed: int,
    teacher=None,
    dropout: bool = False,
    proximal: ProximalTerm | None = None,
) -> dict:
    """``steps`` optimizer steps on ``pairs`` (cycled, seeded shuffle; ``seed`` 32 bits, as
    transformers' ``set_seed`` takes). The teacher of KD-GLE is ``teacher`` (the received
    global model, frozen), else a frozen copy of ``model`` as it is on entry; ``proximal``:
    FedProx's term, anchored where the caller built it. Reports each term's mean over the steps,
    the first step's KD term (zero when the student starts from the teacher's weights and
    trains without dropout) and the last step's KD / InfoNCE gradient-norm ratio."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )

    if not pairs:
        raise ValueError("no training pairs")
    if steps <= 0:
        return {"steps": 0}
    clock = StepClock()
    teacher = (teacher or frozen_copy(model)) if kd_weight else None
    loss = KDInfoNCELoss(model, temperature, kd_weight, teacher, proximal, ratio_step=steps - 1)
    need = steps * batch_size
    rows = (pairs * (need // len(pairs) + 1))[: max(need, len(pairs))]
    data = Dataset.from_dict({"anchor": [q for q, _ in rows], "positive": [p for _, p in rows]})
    with tempfile.TemporaryDirectory() as tmp:
        args = SentenceTransformerTrainingArguments(
            output_dir=tmp,
            max_steps=steps,
            per_device_train_batch_size=batch_size,
            learning_rate=lr,
            warmup_steps=0,
            lr_scheduler_type="constant",
            seed=seed,
            data_seed=seed,
            save_strategy="no",
            report_to="none",
            logging_steps=max(1, steps),
            disable_tqdm=True,
            use_cpu=model.device.type == "cpu",  # the trainer would move it to a GPU
            batch_sampler="no_duplicates",
            dataloader_drop_last=True,
        )
        trainer = SentenceTransformerTrainer(
            model=model, args=args, train_dataset=data, loss=loss, callbacks=[clock]
        )
        with collect_only_new_objects(), without_dropout(model, not dropout):
            out = trainer.train()
    model.eval()
    terms = {k: sum(h[k] for h in loss.history) / len(loss.history) for k in loss.last}
    first = (
        {"kd-first": loss.history[0]["kd"], "kd-grad-ratio": loss.grad_ratio} if kd_weight else {}
    )
    return {
        "steps": steps,
        "loss": float(out.training_loss),
        **terms,
        **first,
        "setup-seconds": clock.begin - clock.start,
        "step-seconds": clock.end - clock.begin,
    }
