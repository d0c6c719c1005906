"""Training pairs from a client's own pages without an LLM: inverse-cloze pseudo-queries.

Inverse cloze (Lee et al., 2019): a sentence or table line of a chunk is the query and the
chunk without it is the positive, so the pair needs no labeller. 10-K boilerplate repeats across
a company's filings, so ``unique_inverse_cloze`` only takes a segment that occurs whole on one
page of the client's filings (else the filing title is all that tells the pairs apart).
``headers`` asks template questions about the section headers and table captions the page text
exposes (Title Case lines), the text below as the positive. ``line_item_questions`` asks a
template question for each line item of the statement tables on a page ("What was Boeing's total
revenues in FY2022?"), the page itself as the positive, as FinanceBench's metric questions ask for
a statement line of a company and year. An LLM generator (any transformers text-generation model)
is the option for users who have one; none loads offline, so the templates are the stand-in.
"""

from __future__ import annotations

import random
import re
from collections import Counter

_SEGMENT = re.compile(r"\n+|(?<=[.!?])\s+")
_HEADER_WORD = re.compile(r"[A-Z][A-Za-z'&/-]*|and|of|the|in|for|to|on|from|by|with|or|a|an|other")
_NUMBER_LINE = re.compile(r"^[\s$()%.,*\u2014-]*\d[\d\s$()%.,*\u2014-]*$")
SECTION_QUESTIONS = (
    "What does the filing report about {h}?",
    "What did the company disclose on {h}?",
    "How does the company describe its {h}?",
)
TABLE_QUESTIONS = (
    "What figures does the {h} table show?",
    "What were the amounts reported for {h}?",
)
LINE_ITEM_QUESTION = "What was {company}'s {item} in FY{year}?"
_YEAR = re.compile(r"^(19|20)\d\d$")
_LETTER = re.compile(r"[A-Za-z]")
# an amount (1.25, 55,893, $9, (43)), not a page number
_AMOUNT = re.compile(r"\d[\d,]*\.\d|\d,\d{3}|[$(]\s*\d")
_STATEMENT = re.compile(
    r"(statements?|summary) of (consolidated )?(operations|income|earnings|cash flows|"
    r"financial (position|condition)|comprehensive|(changes in )?\w+ equity)|balance sheets?",
    re.IGNORECASE,
)


def chunk_words(text: str, size: int, overlap: int) -> list[str]:
    """Windows of ``size`` words advancing by ``size - overlap``, line breaks kept."""
    if not 0 <= overlap < size:
        raise ValueError(f"need 0 <= overlap < size, got size={size} overlap={overlap}")
    tokens = re.findall(r"\S+\n*|\n+", text)
    tokens = [t for t in tokens if t.strip()]
    step, chunks = size - overlap, []
    for start in range(0, max(len(tokens) - overlap, 1), step):
        chunk = (
            " ".join(
                t.rstrip("\n") + ("\n" if t.endswith("\n") else "")
                for t in tokens[start : start + size]
            )
            .replace("\n ", "\n")
            .strip()
        )
        if chunk:
            chunks.append(chunk)
    return chunks


def segments(chunk: str) -> list[str]:
    return [s.strip() for s in _SEGMENT.split(chunk) if s and s.strip()]


def normalized(segment: str) -> str:
    return " ".join(segment.lower().split())


def single_page_segments(pages: list[str]) -> frozenset[str]:
    """Normalized segments that occur on exactly one of ``pages`` (the others are boilerplate)."""
    counts = Counter(key for page in pages for key in {normalized(s) for s in segments(page)})
    return frozenset(key for key, n in counts.items() if n == 1)


def inverse_cloze_pair(
    chunk: str,
    rng: random.Random,
    min_query_words: int,
    max_query_words: int,
    allowed: frozenset[str] | None = None,
) -> tuple[str, str] | None:
    """(query, positive): one segment with a usable length (and in ``allowed``, normalized, where
    given), and the chunk with it removed."""
    parts = segments(chunk)
    candidates = [
        i
        for i, s in enumerate(parts)
        if min_query_words <= len(s.split()) <= max_query_words
        and (allowed is None or normalized(s) in allowed)
    ]
    if not candidates or len(parts) < 2:
        return None
    pick = rng.choice(candidates)
    positive = "\n".join(s for i, s in enumerate(parts) if i != pick)
    if len(positive.split()) < min_query_words:
        return None
    return parts[pick], positive


def inverse_cloze_pairs(
    pages: list[str],
    chunk_size: int,
    chunk_overlap: int,
    min_query_words: int,
    max_query_words: int,
    seed: int,
    allowed: frozenset[str] | None = None,
) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for page in pages:
        for chunk in chunk_words(page, chunk_size, chunk_overlap):
            pair = inverse_cloze_pair(chunk, rng, min_query_words, max_query_words, allowed)
            if pair:
                pairs.append(pair)
    return pairs


def is_header(line: str) -> bool:
    """A section header or table caption as the PDF text shows it: 2-8 Title Case words, no
    sentence punctuation ("Results of Operations", "Loss From Operations")."""
    words = line.split()
    return (
        2 <= len(words) <= 8
        and line[0].isupper()
        and normalized(line) != "table of contents"
        and all(_HEADER_WORD.fullmatch(w) for w in words)
    )


def header_pairs(
    pages: list[str], chunk_size: int, min_words: int, seed: int
) -> list[tuple[str, str]]:
    """(template question about a header, the next ``chunk_size`` words below it) for each header
    with at least ``min_words`` below; a caption over mostly numeric lines asks for its figures."""
    rng, pairs = random.Random(seed), []
    for page in pages:
        lines = [line.strip() for line in page.split("\n") if line.strip()]
        for i, line in enumerate(lines):
            if not is_header(line):
                continue
            below = " ".join(" ".join(lines[i + 1 :]).split()[:chunk_size])
            if len(below.split()) < min_words:
                continue
            numeric = sum(bool(_NUMBER_LINE.match(n)) for n in lines[i + 1 : i + 9])
            templates = TABLE_QUESTIONS if numeric >= 3 else SECTION_QUESTIONS
            pairs.append((rng.choice(templates).format(h=line), below))
    return pairs


def statement_lines(page: str, min_items: int = 5, max_words: int = 12) -> list[str]:
    """The line items of a financial statement's table as a page's PDF text shows it, in page
    order, each once. The page names a statement (``Consolidated Statements of Operations``,
    ``Balance Sheets``, ...); a line item is a label line (letters, at most ``max_words`` words,
    not a sentence ending in a full stop) directly followed by a figure line (``$55,893``,
    ``(4,187)``; a bare year is a column header). A page with fewer than ``min_items`` labels
    over amounts (a separator, a sign or a decimal: not a table of contents' page numbers) is no
    statement table: []."""
    if not _STATEMENT.search(page):
        return []
    lines = [line.strip() for line in page.split("\n") if line.strip()]
    found = [
        (label.rstrip(" ,:;"), below)
        for label, below in zip(lines, lines[1:])
        if _LETTER.search(label)
        and not _NUMBER_LINE.match(label)
        and len(label.split()) <= max_words
        and not label.endswith(".")
        and _NUMBER_LINE.match(below)
        and not _YEAR.match(below)
    ]
    if sum(bool(_AMOUNT.search(below)) for _, below in found) < min_items:
        return []
    return list(dict.fromkeys(label for label, _ in found if label))


def line_item_question(company: str, item: str, year: int | str) -> str:
    """The template question for one statement line: its label lower-cased unless an acronym
    leads it (``EBITDA`` stays)."""
    if len(item) > 1 and not item[1].isupper():
        item = item[0].lower() + item[1:]
    return LINE_ITEM_QUESTION.format(company=company, item=item, year=year)


def line_item_pairs(
    pages: list[str], company: str, year: int | str, exclude: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """(template question on a statement line, the page it is on) for every line item of every
    statement-table page of one filing (``company``, fiscal ``year``). A question whose
    normalized text is in ``exclude`` (the evaluation questions) is dropped, so no evaluation
    question, nor any (evaluation question, page) pair, ever trains."""
    return [
        (question, page)
        for page in pages
        for item in statement_lines(page)
        if normalized(question := line_item_question(company, item, year)) not in exclude
    ]


class LLMQueryGenerator:
    """Asks a transformers text-generation model for a question each chunk answers."""

    PROMPT = (
        "Write one question that the following passage from a company filing answers."
        "\n\nPassage:\n{chunk}\n\nQuestion:"
    )

    def __init__(self, model: str, max_new_tokens: int = 32, device: str = "cpu"):
        from transformers import pipeline

        self.generate = pipeline("text-generation", model=model, device=device)
        self.max_new_tokens = max_new_tokens

    def pairs(self, pages: list[str], chunk_size: int, chunk_overlap: int) -> list[tuple[str, str]]:
        chunks = [c for p in pages for c in chunk_words(p, chunk_size, chunk_overlap)]
        prompts = [self.PROMPT.format(chunk=c) for c in chunks]
        out = self.generate(
            prompts, max_new_tokens=self.max_new_tokens, do_sample=False, return_full_text=False
        )
        queries = [o[0]["generated_text"].strip().split("\n")[0] for o in out]
        return [(q, c) for q, c in zip(queries, chunks) if q]
