"""FinanceBench as a federated retrieval task (METHODS.md section 3); no Flower code here.

Clients are groups of documents (by default one company each) cut by a flwr-datasets
partitioner over the document table; evaluation uses the public questions, whose evidence
pages (0-based, as in ``pages/``) are the relevant corpus entries.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from datasets import Dataset
from flwr_datasets.partitioner import Partitioner

from fedsim.config.data import require_file
from fedsim.seeding import stream

UPSTREAM = "github.com/patronus-ai/financebench (CC BY-NC 4.0)"
FOLDER = "financebench"


@dataclass(frozen=True)
class Question:
    qid: str
    text: str
    company: str
    doc_name: str
    evidence: tuple[str, ...]  # corpus ids "<doc>#<page>"


def page_id(doc_name: str, page: int) -> str:
    return f"{doc_name}#{page}"


def _jsonl(path: Path) -> list[dict]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


@lru_cache(maxsize=4)
def load_documents(root: str) -> tuple[dict, ...]:
    """Document table (doc_name, company, gics_sector, ...) with ``has_pages`` added."""
    base = Path(root) / FOLDER
    docs = _jsonl(require_file(base / "financebench_document_information.jsonl", UPSTREAM))
    for doc in docs:
        doc["has_pages"] = (base / "pages" / f"{doc['doc_name']}.jsonl.gz").is_file()
    return tuple(sorted(docs, key=lambda d: (d["company"], d["doc_name"])))


def title(root: str, doc_name: str) -> str:
    """A filing's title as the questions name it: company, fiscal year, form (``3M FY2018 10K``)."""
    doc = next((d for d in load_documents(root) if d["doc_name"] == doc_name), None)
    if doc is None:
        return doc_name.replace("_", " ")
    return f"{doc['company']} FY{doc['doc_period']} {str(doc['doc_type']).upper()}"


@lru_cache(maxsize=4)
def load_questions(root: str) -> tuple[Question, ...]:
    path = require_file(Path(root) / FOLDER / "financebench_open_source.jsonl", UPSTREAM)
    return tuple(
        sorted(
            (
                Question(
                    q["financebench_id"],
                    q["question"],
                    q["company"],
                    q["doc_name"],
                    tuple(
                        dict.fromkeys(
                            page_id(e["doc_name"], int(e["evidence_page_num"]))
                            for e in q["evidence"]
                        )
                    ),
                )
                for q in _jsonl(path)
            ),
            key=lambda q: q.qid,
        )
    )


@lru_cache(maxsize=4)
def question_texts(root: str) -> frozenset[str]:
    """Every FinanceBench question's text, normalized, whichever split holds it: what a pair
    builder must never train on."""
    from fedsim_tasks.financebench_rag.pseudo_queries import normalized

    return frozenset(normalized(q.text) for q in load_questions(root))


QUESTION_SPLIT = stream("question-split")  # of the split seed


def split_questions(root: str, n_valid: int, n_test: int, seed: int) -> dict[str, list[Question]]:
    """Deterministic validation/test split: a seeded shuffle of the id-sorted questions."""
    questions = list(load_questions(root))
    if n_valid + n_test > len(questions):
        raise ValueError(f"n_valid + n_test = {n_valid + n_test} > {len(questions)} questions")
    random.Random(QUESTION_SPLIT.seed(seed)).shuffle(questions)
    return {"valid": questions[:n_valid], "test": questions[n_valid : n_valid + n_test]}


@lru_cache(maxsize=512)
def load_pages(root: str, doc_name: str) -> tuple[str, ...]:
    """Page texts of one document, indexed by 0-based page number."""
    path = require_file(Path(root) / FOLDER / "pages" / f"{doc_name}.jsonl.gz", UPSTREAM)
    with gzip.open(path, "rt") as f:
        rows = sorted((json.loads(line) for line in f), key=lambda r: r["page"])
    return tuple(r["text"] for r in rows)


def build_corpus(
    root: str,
    doc_names: list[str],
    pages_per_doc: int | None = None,
    keep: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """Page-level corpus over ``doc_names``: every page of the documents whose PDF text exists
    (or the first ``pages_per_doc`` plus the ``keep`` ids, for small slices); for missing
    PDFs, the evidence pages carried in the question file (their full text)."""
    have = {d["doc_name"]: d["has_pages"] for d in load_documents(root)}
    corpus: dict[str, str] = {}
    fallback = _evidence_pages(root)
    for doc in sorted(set(doc_names)):
        if have.get(doc):
            corpus.update(
                (page_id(doc, i), text)
                for i, text in enumerate(load_pages(root, doc))
                if pages_per_doc is None or i < pages_per_doc or page_id(doc, i) in keep
            )
        else:
            corpus.update(
                (page, text) for page, text in fallback.items() if page.split("#")[0] == doc
            )
    return corpus


@lru_cache(maxsize=4)
def _evidence_pages(root: str) -> dict[str, str]:
    path = Path(root) / FOLDER / "financebench_open_source.jsonl"
    return {
        page_id(e["doc_name"], int(e["evidence_page_num"])): e["evidence_text_full_page"]
        for q in _jsonl(path)
        for e in q["evidence"]
    }


def corpus_documents(root: str, questions: list[Question], scope: str) -> list[str]:
    """Documents of a corpus: ``cited`` = those the questions cite, ``all`` = every document."""
    if scope == "all":
        return [d["doc_name"] for d in load_documents(root)]
    if scope == "cited":
        return sorted({e.split("#")[0] for q in questions for e in q.evidence})
    raise ValueError(f"corpus scope must be 'cited' or 'all', got {scope!r}")


def document_table(root: str, companies: list[str] | None) -> Dataset:
    """Documents with page text, restricted to ``companies`` (None = all), as a Dataset that
    flwr-datasets partitioners cut into clients."""
    docs = [d for d in load_documents(root) if d["has_pages"]]
    if companies is not None:
        known = {d["company"] for d in load_documents(root)}
        unknown = [c for c in companies if c not in known]
        if unknown:
            raise ValueError(
                f"No FinanceBench documents for {unknown}; companies present: {sorted(known)}"
            )
        docs = [d for d in docs if d["company"] in set(companies)]
    if not docs:
        raise ValueError("the client selection holds no document with page text")
    return Dataset.from_dict(
        {k: [d[k] for d in docs] for k in ("doc_name", "company", "gics_sector", "doc_type")}
    )


def client_documents(
    root: str, companies: list[str] | None, partitioner: Partitioner, partition_id: int
) -> list[str]:
    partitioner.dataset = document_table(root, companies)
    if partition_id >= partitioner.num_partitions:
        raise ValueError(f"partition {partition_id} >= {partitioner.num_partitions} clients")
    return sorted(partitioner.load_partition(partition_id)["doc_name"])


def owners(
    root: str, questions: list[Question], groups: dict[str, list[str]]
) -> dict[str, list[Question]]:
    """Each group's questions (group -> its documents, e.g. a client's): a question belongs to
    the group holding its filing, else to the one holding its company's other filings (a filing
    without page text is in no group), else to none."""
    company = {d["doc_name"]: d["company"] for d in load_documents(root)}
    by_doc = {doc: g for g, docs in groups.items() for doc in docs}
    by_company: dict[str, set[str]] = {}
    for g, docs in groups.items():
        for doc in docs:
            by_company.setdefault(company[doc], set()).add(g)
    out: dict[str, list[Question]] = {g: [] for g in groups}
    for q in questions:
        held = by_company.get(q.company, set())
        owner = by_doc.get(q.doc_name) or (next(iter(held)) if len(held) == 1 else None)
        if owner is not None:
            out[owner].append(q)
    return out
