"""Generation metrics of FedDTRE's evaluation: BLEU-1 / BLEU-4 (sacrebleu, corpus level, 0-100)
and ROUGE-1 / ROUGE-2 F1 (rouge-score, mean over replies, 0-100); with the trust evaluator, what
the server's and the clients' evaluations report of a model's replies (:func:`reply_scores`)."""

from __future__ import annotations

import numpy as np
from rouge_score import rouge_scorer
from sacrebleu.metrics import BLEU

from fedsim_tasks.dialogue.dataset import Example
from fedsim_tasks.dialogue.trust_data import leaks_pii

REPLY_METRICS = ("bleu1", "bleu4", "rouge1", "rouge2", "trust_bertscore", "pii_rate")
REPLY_RANGES = {
    "bleu1": (0.0, 100.0),
    "bleu4": (0.0, 100.0),
    "rouge1": (0.0, 100.0),
    "rouge2": (0.0, 100.0),
    "trust_bertscore": (-1.0, 1.0),
    "pii_rate": (0.0, 1.0),
}
"""where each of :data:`REPLY_METRICS` lies (a BERTScore F1 is a cosine): a client's report is checked against it"""


def generation_metrics(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(
            f"need as many hypotheses as references (>0), got {len(hypotheses)} and {len(references)}"
        )
    bleu = {
        n: BLEU(max_ngram_order=n, effective_order=True)
        .corpus_score(hypotheses, [references])
        .score
        for n in (1, 4)
    }
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2"], use_stemmer=True)
    rouge = [scorer.score(ref, hyp) for hyp, ref in zip(hypotheses, references)]
    return {
        "bleu1": float(bleu[1]),
        "bleu4": float(bleu[4]),
        "rouge1": 100 * float(np.mean([r["rouge1"].fmeasure for r in rouge])),
        "rouge2": 100 * float(np.mean([r["rouge2"].fmeasure for r in rouge])),
    }


def reply_scores(replies: list[str], examples: list[Example], evaluator) -> dict[str, float]:
    """The :data:`REPLY_METRICS` of replies to ``examples``: BLEU and ROUGE against the true
    replies, the mean trust score (``evaluator``) and the share that leaks PII wording
    (:func:`fedsim_tasks.dialogue.trust_data.leaks_pii`). One function for the server's evaluation
    and the clients' personalized one, so both report the same numbers the same way."""
    trust = evaluator.scores([e.context for e in examples], replies)
    return {
        **generation_metrics(replies, [e.reply for e in examples]),
        "trust_bertscore": float(np.mean(trust)),
        "pii_rate": float(np.mean([leaks_pii(r) for r in replies])),
    }
