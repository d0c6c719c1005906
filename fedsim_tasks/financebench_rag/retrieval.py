"""Retrieval evaluation: FAISS index over page embeddings, metrics from sentence-transformers.

Corpus embeddings are built piece by piece (a bounded unit of work per call) and kept per
(model weights, sequence length, corpus) fingerprint, so the vanilla model's corpus is encoded
once per machine and a re-evaluation costs nothing. The
metric definitions are sentence-transformers' InformationRetrievalEvaluator's (MAP@k divides by
min(k, #relevant)); Hit@k is its accuracy@k.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import numpy as np

log = logging.getLogger("fedsim")

METRICS = (
    "hit@1",
    "hit@10",
    "mrr@10",
    "map@10",
    "ndcg@10",
    "recall@1",
    "recall@5",
    "recall@10",
    "precision@1",
    "precision@5",
    "precision@10",
)
_ST_NAMES = {
    "hit": "accuracy@k",
    "mrr": "mrr@k",
    "map": "map@k",
    "ndcg": "ndcg@k",
    "recall": "recall@k",
    "precision": "precision@k",
}


def fingerprint(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
    return h.hexdigest()[:20]


def weights_key(model: str, lora, arrays: dict | None) -> str:
    """Names a model's weights: the base model, the adapter config and the trainable values
    (``None``: the common initial weights). Server and client compute it alike."""
    if arrays is None:
        return fingerprint(model, lora, "initial")
    return fingerprint(model, lora, *(np.ascontiguousarray(a).tobytes() for a in arrays.values()))


class EmbeddingStore:
    """Normalized float32 corpus embeddings under one (weights, length, corpus) key, built one
    piece of ``piece_pages`` pages per call, so no single call's work grows with the corpus.
    Pieces and the assembled file are written then renamed; an interrupted build resumes."""

    def __init__(self, folder: str | Path, key: str, num_pages: int, piece_pages: int):
        self.folder = Path(folder).expanduser()
        self.key, self.num_pages, self.piece_pages = key, num_pages, piece_pages
        self.pieces = max(1, -(-num_pages // piece_pages))
        self.path = self.folder / f"{key}.npy"

    def _piece(self, i: int) -> Path:
        return self.folder / f"{self.key}.p{self.piece_pages}" / f"{i}.npy"

    def missing(self) -> list[int]:
        if self.path.is_file():
            return []
        return [i for i in range(self.pieces) if not self._piece(i).is_file()]

    def encode_piece(self, i: int, encode, texts: list[str]) -> list[int]:
        """Encode piece ``i`` of ``texts`` with ``encode`` (texts -> normalized embeddings,
        ``inference.corpus_encoder``) unless it is in already (or past the end); return the
        pieces still missing. Several nodes may fill one store, each its own pieces."""
        missing = self.missing()
        if i in missing:
            start = time.perf_counter()
            chunk = texts[i * self.piece_pages : (i + 1) * self.piece_pages]
            _save(self._piece(i), encode(chunk).astype(np.float32))
            log.info(
                "encoded corpus piece %d/%d (%d pages) in %.0f s",
                i + 1,
                self.pieces,
                len(chunk),
                time.perf_counter() - start,
            )
            missing.remove(i)
        return missing

    def load(self) -> np.ndarray:
        """The whole corpus's embeddings; assembles (and keeps) them once every piece is in."""
        if self.path.is_file():
            return np.load(self.path)
        if missing := self.missing():
            raise RuntimeError(
                f"corpus embeddings {self.key} miss pieces {missing[:5]} of "
                f"{self.pieces}: encode them first"
            )
        emb = np.concatenate([np.load(self._piece(i)) for i in range(self.pieces)])
        if len(emb) != self.num_pages:
            raise RuntimeError(
                f"corpus embeddings {self.key}: {len(emb)} rows for {self.num_pages} pages"
            )
        _save(self.path, emb)
        for i in range(self.pieces):
            self._piece(i).unlink()
        self._piece(0).parent.rmdir()
        return emb


def _save(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, array)
    tmp.replace(path)


def build_index(embeddings: np.ndarray, factory: str):
    """A FAISS inner-product index (``Flat`` exact; e.g. ``HNSW32`` for large corpora)."""
    import faiss

    index = faiss.index_factory(embeddings.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(embeddings)
    index.add(embeddings)
    return index


def search(index, query_embeddings: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    return index.search(np.ascontiguousarray(query_embeddings, dtype=np.float32), k)


def retrieval_metrics(
    ranked: dict[str, list[tuple[str, float]]], relevant: dict[str, set[str]]
) -> dict[str, float]:
    """``METRICS`` from ranked (corpus_id, score) lists per query id, computed by
    sentence-transformers' ``InformationRetrievalEvaluator``."""
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    evaluator = InformationRetrievalEvaluator(
        queries={q: q for q in ranked},
        corpus={},
        relevant_docs=relevant,
        accuracy_at_k=[1, 10],
        precision_recall_at_k=[1, 5, 10],
        mrr_at_k=[10],
        ndcg_at_k=[10],
        map_at_k=[10],
        show_progress_bar=False,
        write_csv=False,
    )
    results = [
        [{"corpus_id": cid, "score": float(s)} for cid, s in ranked[q]]
        for q in evaluator.queries_ids
    ]
    scores = evaluator.compute_metrics(results)
    out = {}
    for name in METRICS:
        metric, k = name.split("@")
        out[name] = float(scores[_ST_NAMES[metric]][int(k)])
    return out


def page_of(corpus_id: str) -> str:
    """The page of a corpus entry: ``<doc>#<page>`` itself, or the page of a passage
    ``<doc>#<page>#<j>``."""
    return "#".join(corpus_id.split("#")[:2])


def passages(
    corpus: dict[str, str], words: int | None, overlap: int, titles: dict[str, str] | None = None
) -> dict[str, str]:
    """Each page cut into passages of ``words`` words (``overlap`` shared), ids
    ``<page>#<j>``; ``words`` None keeps one entry per page (cut at the model's length).
    ``titles`` (doc -> title) leads every entry with its filing's title."""
    from fedsim_tasks.financebench_rag.pseudo_queries import chunk_words

    lead = (
        (lambda cid, text: f"{titles[cid.split('#')[0]]}\n{text}")
        if titles
        else (lambda cid, text: text)
    )
    if not words:
        return {page: lead(page, text) for page, text in corpus.items()} if titles else corpus
    return {
        f"{page}#{j}": lead(page, chunk)
        for page, text in corpus.items()
        for j, chunk in enumerate(chunk_words(text, words, overlap) or [text])
    }


PASSAGE_DEPTH = 20  # passages searched per page asked for: enough for k distinct pages


def _ranked_pages(
    ids: list[str], rows: np.ndarray, scores: np.ndarray, k: int
) -> list[tuple[str, float]]:
    """The first ``k`` distinct pages of one ranked row, each scored by its best entry."""
    out, seen = [], set()
    for r, score in zip(rows, scores):
        page = page_of(ids[r]) if r >= 0 else None
        if page is not None and page not in seen:
            seen.add(page)
            out.append((page, float(score)))
    return out[:k]


def _search_pages(
    index, q_emb: np.ndarray, ids: list[str], k: int
) -> list[list[tuple[str, float]]]:
    """Top-k pages per query; with passages, a page scores as its best passage."""
    by_page = all(page_of(c) == c for c in ids)
    scores, rows = search(index, q_emb, min(len(ids), k if by_page else k * PASSAGE_DEPTH))
    return [_ranked_pages(ids, row, score, k) for row, score in zip(rows, scores)]


def evaluate(
    model,
    questions,
    corpus_ids: list[str],
    corpus_emb: np.ndarray,
    factory: str = "Flat",
    k: int = 10,
) -> dict[str, float]:
    """Retrieve the top-k pages for each question from the corpus rows given and score them."""
    known = {page_of(c) for c in corpus_ids}
    missing = [e for q in questions for e in q.evidence if e not in known]
    if missing:
        raise ValueError(f"{len(missing)} evidence pages are not in the corpus, e.g. {missing[0]}")
    index = build_index(corpus_emb, factory)
    q_emb = model.encode(
        [q.text for q in questions],
        batch_size=32,
        convert_to_numpy=True,
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    ranked = dict(zip((q.qid for q in questions), _search_pages(index, q_emb, corpus_ids, k)))
    return retrieval_metrics(ranked, {q.qid: set(q.evidence) for q in questions})


def evaluate_per_filing(
    model, questions, corpus_ids: list[str], corpus_emb: np.ndarray, k: int = 10
) -> dict[str, float]:
    """Each question retrieves only among the pages of its own filing (FinanceBench's
    per-document store): one exact index per document, over the corpus rows of that document."""
    rows: dict[str, list[int]] = {}
    for i, cid in enumerate(corpus_ids):
        rows.setdefault(cid.split("#")[0], []).append(i)
    q_emb = model.encode(
        [q.text for q in questions],
        batch_size=32,
        convert_to_numpy=True,
        normalize_embeddings=True,
        show_progress_bar=False,
    )
    ranked = {}
    for doc in sorted({q.doc_name for q in questions}):
        asked = [i for i, q in enumerate(questions) if q.doc_name == doc]
        filing = [corpus_ids[r] for r in rows.get(doc, [])]
        pages = {page_of(c) for c in filing}
        missing = [e for i in asked for e in questions[i].evidence if e not in pages]
        if missing:
            raise ValueError(
                f"{len(missing)} evidence pages are not in their filing {doc}, e.g. {missing[0]}"
            )
        found = _search_pages(build_index(corpus_emb[rows[doc]], "Flat"), q_emb[asked], filing, k)
        ranked.update({questions[i].qid: pages for i, pages in zip(asked, found)})
    return retrieval_metrics(ranked, {q.qid: set(q.evidence) for q in questions})


def evaluation_data(root: str, task: dict) -> tuple[dict, dict[str, str]]:
    """The question splits and the test corpus (scope ``task.test_corpus``; page id -> text)."""
    from fedsim_tasks.financebench_rag.dataset import (
        build_corpus,
        corpus_documents,
        split_questions,
        title,
    )

    questions = split_questions(root, task["n_valid"], task["n_test"], task["split_seed"])
    every = questions["valid"] + questions["test"]
    corpus = build_corpus(
        root,
        corpus_documents(root, every, task["test_corpus"]),
        task.get("corpus_pages_per_doc"),
        frozenset(e for q in every for e in q.evidence),
    )
    cut = task.get("passages") or {}
    titles = (
        {doc: title(root, doc) for doc in {c.split("#")[0] for c in corpus}}
        if cut.get("titles")
        else None
    )
    return questions, passages(corpus, cut.get("words"), int(cut.get("overlap", 0)), titles)


def corpus_store(
    model,
    model_key: str,
    corpus: dict[str, str],
    folder: str | Path,
    piece_pages: int,
    backend: str,
) -> EmbeddingStore:
    """The store of this corpus under these weights, encoded by ``backend`` (in the key: the
    backends agree only to float precision). The key holds the entries' texts, not only their
    ids: the same pages led by titles or cut otherwise are another corpus."""
    texts = fingerprint(*(t.encode() for t in corpus.values()))
    return EmbeddingStore(
        folder,
        fingerprint(model_key, model.max_seq_length, list(corpus), texts, backend),
        len(corpus),
        piece_pages,
    )


def score_splits(
    model,
    root: str,
    questions: dict,
    corpus_ids: list[str],
    emb: np.ndarray,
    task: dict,
    splits: list[str],
    per_filing: bool = False,
    groups: dict[str, list[str]] | None = None,
) -> dict[str, float]:
    """``<split>/<metric>`` for the question splits asked. The validation corpus (the documents
    the validation questions cite) is a subset of the test corpus, searched through its own
    index. ``per_filing`` adds ``<split>-filing/<metric>``: each question searches its own
    filing only, for the questions whose filing has page text (a filing without it would be its
    evidence pages alone). ``groups`` (label -> documents, e.g. each client's) adds
    ``<split>-client<label>/<metric>`` for each group that owns questions of the split
    (``dataset.owners``): its questions searched among its own filings' corpus entries."""
    from fedsim_tasks.financebench_rag.dataset import corpus_documents, load_documents

    out = {}
    for split in splits:
        if split == "valid":
            docs = set(corpus_documents(root, questions["valid"], "cited"))
            rows = [i for i, cid in enumerate(corpus_ids) if cid.split("#")[0] in docs]
        else:
            rows = list(range(len(corpus_ids)))
        metrics = evaluate(
            model,
            questions[split],
            [corpus_ids[i] for i in rows],
            emb[rows],
            task.get("index", "Flat"),
        )
        out.update({f"{split}/{k}": v for k, v in metrics.items()})
        out[f"{split}/corpus-pages"] = len({page_of(corpus_ids[i]) for i in rows})
        out[f"{split}/corpus-entries"] = len(rows)
        out[f"{split}/questions"] = len(questions[split])
    have = {d["doc_name"] for d in load_documents(root) if d["has_pages"]} if per_filing else set()
    for split in splits if per_filing else []:
        asked = [q for q in questions[split] if q.doc_name in have]
        out.update(
            {
                f"{split}-filing/{k}": v
                for k, v in evaluate_per_filing(model, asked, corpus_ids, emb).items()
            }
        )
        filings = {q.doc_name for q in asked}
        out[f"{split}-filing/corpus-pages"] = len(
            {page_of(c) for c in corpus_ids if c.split("#")[0] in filings}
        )
        out[f"{split}-filing/questions"] = len(asked)
    for split in splits if groups else []:
        out.update(
            _score_groups(model, root, questions[split], corpus_ids, emb, groups, f"{split}-client")
        )
    return out


def _score_groups(
    model,
    root: str,
    questions: list,
    corpus_ids: list[str],
    emb: np.ndarray,
    groups: dict[str, list[str]],
    prefix: str,
) -> dict[str, float]:
    """Each group's questions within the corpus entries of its documents (and of the filings its
    questions cite: a filing without page text is its evidence pages)."""
    from fedsim_tasks.financebench_rag.dataset import owners

    out = {}
    for label, asked in owners(root, questions, groups).items():
        if not asked:
            continue
        docs = set(groups[label]) | {e.split("#")[0] for q in asked for e in q.evidence}
        rows = [i for i, cid in enumerate(corpus_ids) if cid.split("#")[0] in docs]
        metrics = evaluate(model, asked, [corpus_ids[i] for i in rows], emb[rows])
        out.update({f"{prefix}{label}/{k}": v for k, v in metrics.items()})
        out[f"{prefix}{label}/corpus-pages"] = len({page_of(corpus_ids[i]) for i in rows})
        out[f"{prefix}{label}/questions"] = len(asked)
    return out
