"""TF-IDF evidence router with a topic-preference prior, and its per-turn metrics.

score(e) = cosine(TF-IDF(query), TF-IDF(e)) + lambda * p_hat[e], over the speaker's three
candidates; p_hat = alpha * mu + (1 - alpha) * p_c. Ties go to the first candidate (FS1).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from sklearn.feature_extraction.text import CountVectorizer, TfidfVectorizer

from .dataset import Conversation, Topics, load_topics

QUERY_CONTEXT = 3  # previous utterances joined into the query
AMBIGUITY_MARGIN = 0.005  # top-2 TF-IDF cosine within this margin marks a turn ambiguous


@dataclass(frozen=True)
class RouterVariant:
    """One router setting: ``prior`` names a released global prior, or is '' for none."""

    name: str
    prior: str
    alpha: float
    lam: float


class EvidenceRouter:
    """Vectorizer fitted on the evidence texts, shared by routing and the ERR metric."""

    def __init__(self, topics: Topics):
        self.vectorizer = TfidfVectorizer(ngram_range=(1, 2), stop_words="english")
        self.evidence = self.vectorizer.fit_transform(topics.texts)  # rows L2-normalized
        analyzer = CountVectorizer(token_pattern=r"(?u)\b\w+\b").build_analyzer()
        self._tokens = analyzer
        self.evidence_tokens = [frozenset(analyzer(t)) for t in topics.texts]
        self.num_topics = len(topics)

    def route(
        self,
        conv: Conversation,
        p_local: np.ndarray,
        priors: dict[str, np.ndarray],
        variants: list[RouterVariant],
    ) -> dict[str, np.ndarray]:
        """Route the grounded second-half turns of ``conv`` under every variant.

        Returns per-turn arrays: ``gold``, ``ambiguous`` and, per variant name,
        ``pick/<name>``, ``err/<name>``, ``support/<name>``.
        """
        idx = [t for t in range(conv.half, len(conv.turns)) if conv.turns[t].gold >= 0]
        messages = [turn.message for turn in conv.turns]
        out: dict[str, np.ndarray] = {"gold": np.array([conv.turns[t].gold for t in idx], int)}
        if not idx:
            out["ambiguous"] = np.zeros(0, bool)
            for v in variants:
                for key in ("pick", "err", "support"):
                    out[f"{key}/{v.name}"] = np.zeros(0)
            return out
        queries = [" ".join(messages[max(0, t - QUERY_CONTEXT) : t]) for t in idx]
        q = self.vectorizer.transform(queries)
        resp = self.vectorizer.transform([messages[t] for t in idx])
        cands = np.array([conv.turns[t].candidates for t in idx])  # (T, 3)
        sims = np.asarray((q @ self.evidence.T).todense())  # (T, topics)
        r = np.take_along_axis(sims, cands, axis=1)  # (T, 3)
        top2 = -np.sort(-r, axis=1)[:, :2]
        out["ambiguous"] = (top2[:, 0] - top2[:, 1]) <= AMBIGUITY_MARGIN
        resp_sims = np.asarray((resp @ self.evidence.T).todense())  # (T, topics)
        resp_tokens = [self._tokens(messages[t]) for t in idx]
        for v in variants:
            if v.prior:
                p_hat = v.alpha * priors[v.prior] + (1.0 - v.alpha) * p_local
            elif v.alpha == 0.0:
                p_hat = p_local
            else:
                raise ValueError(f"variant {v.name}: alpha={v.alpha} needs a global prior")
            scores = r + v.lam * p_hat[cands]
            picks = cands[np.arange(len(idx)), np.argmax(scores, axis=1)]
            out[f"pick/{v.name}"] = picks
            out[f"err/{v.name}"] = resp_sims[np.arange(len(idx)), picks]
            out[f"support/{v.name}"] = np.array(
                [_support(toks, self.evidence_tokens[p]) for toks, p in zip(resp_tokens, picks)]
            )
        return out


def _support(tokens: list[str], evidence: frozenset) -> float:
    """Fraction of the response's tokens that occur in the picked evidence."""
    return sum(tok in evidence for tok in tokens) / len(tokens) if tokens else 0.0


@lru_cache(maxsize=2)
def router_for(data_root: str) -> EvidenceRouter:
    """One fitted router per process and data root (clients are called many times)."""
    return EvidenceRouter(load_topics(data_root))
