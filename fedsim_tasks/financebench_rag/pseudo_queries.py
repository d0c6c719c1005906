"""Training pairs from a client's own pages without an LLM: inverse-cloze pseudo-queries.

Inverse cloze (Lee et al., 2019): a sentence or table line of a chunk is the query and the
chunk without it is the positive, so the pair needs no labeller. An LLM generator (any
transformers text-generation model) is the option for users who have one.
"""

from __future__ import annotations

import random
import re

_SEGMENT = re.compile(r"\n+|(?<=[.!?])\s+")


def chunk_words(text: str, size: int, overlap: int) -> list[str]:
    """Windows of ``size`` words advancing by ``size - overlap``, line breaks kept."""
    if not 0 <= overlap < size:
        raise ValueError(f"need 0 <= overlap < size, got size={size} overlap={overlap}")
    tokens = re.findall(r"\S+\n*|\n+", text)
    tokens = [t for t in tokens if t.strip()]
    step, chunks = size - overlap, []
    for start in range(0, max(len(tokens) - overlap, 1), step):
        chunk = " ".join(t.rstrip("\n") + ("\n" if t.endswith("\n") else "")
                         for t in tokens[start:start + size]).replace("\n ", "\n").strip()
        if chunk:
            chunks.append(chunk)
    return chunks


def segments(chunk: str) -> list[str]:
    return [s.strip() for s in _SEGMENT.split(chunk) if s and s.strip()]


def inverse_cloze_pair(chunk: str, rng: random.Random, min_query_words: int,
                       max_query_words: int) -> tuple[str, str] | None:
    """(query, positive): one segment with a usable length, and the chunk with it removed."""
    parts = segments(chunk)
    candidates = [i for i, s in enumerate(parts)
                  if min_query_words <= len(s.split()) <= max_query_words]
    if not candidates or len(parts) < 2:
        return None
    pick = rng.choice(candidates)
    positive = "\n".join(s for i, s in enumerate(parts) if i != pick)
    if len(positive.split()) < min_query_words:
        return None
    return parts[pick], positive


def inverse_cloze_pairs(pages: list[str], chunk_size: int, chunk_overlap: int,
                        min_query_words: int, max_query_words: int, seed: int
                        ) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for page in pages:
        for chunk in chunk_words(page, chunk_size, chunk_overlap):
            pair = inverse_cloze_pair(chunk, rng, min_query_words, max_query_words)
            if pair:
                pairs.append(pair)
    return pairs


class LLMQueryGenerator:
    """Asks a transformers text-generation model for a question each chunk answers."""

    PROMPT = ("Write one question that the following passage from a company filing answers."
              "\n\nPassage:\n{chunk}\n\nQuestion:")

    def __init__(self, model: str, max_new_tokens: int = 32, device: str = "cpu"):
        from transformers import pipeline
        self.generate = pipeline("text-generation", model=model, device=device)
        self.max_new_tokens = max_new_tokens

    def pairs(self, pages: list[str], chunk_size: int, chunk_overlap: int
              ) -> list[tuple[str, str]]:
        chunks = [c for p in pages for c in chunk_words(p, chunk_size, chunk_overlap)]
        prompts = [self.PROMPT.format(chunk=c) for c in chunks]
        out = self.generate(prompts, max_new_tokens=self.max_new_tokens, do_sample=False,
                            return_full_text=False)
        queries = [o[0]["generated_text"].strip().split("\n")[0] for o in out]
        return [(q, c) for q, c in zip(queries, chunks) if q]
