"""FinanceBench task: metrics on hand-checked rankings, pseudo-queries, split and corpus,
client partitions, and the KD-GLE + InfoNCE loss on a tiny encoder built here."""

import math
import random

import numpy as np
import pytest
import torch

from fedsim.config.compose import compose
from fedsim.config.data import resolve_data_root
from fedsim.config.schema import check
from fedsim.seeding import derived_seed
from fedsim_tasks.financebench_rag import dataset as fb
from fedsim_tasks.financebench_rag.pseudo_queries import (
    chunk_words,
    header_pairs,
    inverse_cloze_pair,
    inverse_cloze_pairs,
    line_item_pairs,
    normalized,
    segments,
    single_page_segments,
    statement_lines,
)
from fedsim_tasks.financebench_rag.retrieval import (
    EmbeddingStore,
    build_index,
    retrieval_metrics,
    search,
)

ROOT = str(resolve_data_root())


def test_metrics_on_hand_checked_rankings():
    ranked = {"a": [("x", 0.9), ("y", 0.8), ("z", 0.7)], "b": [("y", 0.9), ("x", 0.5)]}
    got = retrieval_metrics(ranked, {"a": {"y", "q"}, "b": {"y"}})
    # a: first relevant at rank 2 (RR 1/2), 1 of its 2 relevant found; b: hit at rank 1
    assert got["hit@1"] == 0.5 and got["hit@10"] == 1.0
    assert got["mrr@10"] == pytest.approx((0.5 + 1) / 2)
    assert got["map@10"] == pytest.approx((0.5 / 2 + 1) / 2)
    ndcg_a = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert got["ndcg@10"] == pytest.approx((ndcg_a + 1) / 2)
    assert got["recall@1"] == 0.5 and got["recall@5"] == pytest.approx((0.5 + 1) / 2)
    assert got["precision@1"] == 0.5 and got["precision@5"] == pytest.approx(0.2)
    assert got["precision@10"] == pytest.approx(0.1)


def test_embedding_store_is_filled_piece_by_piece_by_several_nodes(tmp_path):
    """Two stores over one folder (two evaluating nodes): each encodes the pieces it is given,
    skips one already in, and the corpus assembles in page order once every piece is."""
    texts = [f"page {i}" for i in range(10)]
    calls = []

    def encode(chunk):
        calls.append(len(chunk))
        return np.array([[float(t.split()[1]), 1.0] for t in chunk], np.float32)

    a, b = (EmbeddingStore(tmp_path, "weights", 10, 4) for _ in range(2))  # pieces of 4, 4, 2
    assert a.encode_piece(1, encode, texts) == [0, 2]
    assert b.encode_piece(0, encode, texts) == [2]
    assert b.encode_piece(0, encode, texts) == [2] and a.encode_piece(3, encode, texts) == [2]
    assert calls == [4, 4]  # present / past the end: nothing encoded
    with pytest.raises(RuntimeError, match=r"miss pieces \[2\]"):
        a.load()
    assert b.encode_piece(2, encode, texts) == []
    assert np.array_equal(a.load()[:, 0], np.arange(10)) and b.missing() == []


def test_faiss_index_ranks_by_inner_product():
    emb = np.eye(4, dtype=np.float32)
    scores, rows = search(build_index(emb, "Flat"), np.array([[0.1, 0.9, 0.3, 0]]), 3)
    assert rows[0].tolist() == [1, 2, 0]
    assert scores[0][0] == pytest.approx(0.9)


def test_chunking_respects_size_and_overlap():
    text = " ".join(f"w{i}" for i in range(25))
    chunks = chunk_words(text, 10, 3)
    assert [c.split()[0] for c in chunks] == ["w0", "w7", "w14", "w21"]
    assert all(len(c.split()) <= 10 for c in chunks) and chunks[-1].split()[-1] == "w24"
    with pytest.raises(ValueError):
        chunk_words(text, 5, 5)


def test_inverse_cloze_removes_the_query_from_its_positive():
    chunk = (
        "Revenue grew by ten percent in fiscal 2022 overall.\nNet income was 5 million "
        "dollars in the same period.\nShort line"
    )
    query, positive = inverse_cloze_pair(chunk, random.Random(0), 6, 40)
    assert query in chunk and query not in positive
    assert "Short line" in positive  # too short to be a query, kept in the positive
    assert inverse_cloze_pair("one line only here with words", random.Random(0), 3, 40) is None


def test_pseudo_queries_from_real_pages_are_seeded():
    pages = list(fb.load_pages(ROOT, "AES_2020_10K"))[:30]
    a = inverse_cloze_pairs(pages, 96, 16, 6, 40, seed=1)
    assert a == inverse_cloze_pairs(pages, 96, 16, 6, 40, seed=1)
    assert a != inverse_cloze_pairs(pages, 96, 16, 6, 40, seed=2)
    assert len(a) > 30 and all(q not in p for q, p in a)


def _two_filings() -> dict[str, list[str]]:
    """Two PepsiCo 10-Ks' first 40 pages: a real slice where boilerplate repeats across filings."""
    return {
        doc: list(fb.load_pages(ROOT, doc))[:40] for doc in ("PEPSICO_2021_10K", "PEPSICO_2022_10K")
    }


def _seed(doc: str, seed: int) -> int:
    return derived_seed(seed, "pseudo-queries", doc)


def test_unique_inverse_cloze_never_takes_a_segment_found_in_another_filing():
    filings = _two_filings()
    by_filing = {
        doc: {normalized(s) for page in pages for s in segments(page)}
        for doc, pages in filings.items()
    }
    shared = set.intersection(*by_filing.values())
    allowed = single_page_segments([page for pages in filings.values() for page in pages])

    def queries(allowed):
        return {
            normalized(q)
            for doc, pages in filings.items()
            for q, _ in inverse_cloze_pairs(pages, 96, 16, 6, 40, _seed(doc, 0), allowed)
        }

    assert queries(None) & shared  # the plain construction does pick boilerplate here
    kept = queries(allowed)
    assert len(kept) > 100 and not kept & shared


def test_pseudo_queries_are_seeded_by_the_run_seed_and_the_filing():
    pages = _two_filings()["PEPSICO_2022_10K"]
    for build in (
        lambda seed: inverse_cloze_pairs(pages, 96, 16, 6, 40, seed),
        lambda seed: header_pairs(pages, 96, 6, seed),
    ):
        a = build(_seed("PEPSICO_2022_10K", 0))
        assert a == build(_seed("PEPSICO_2022_10K", 0)) and a != build(_seed("PEPSICO_2022_10K", 1))


def test_header_queries_are_questions_about_a_header_over_its_text():
    pages = _two_filings()["PEPSICO_2022_10K"]
    pairs = header_pairs(pages, 96, 6, _seed("PEPSICO_2022_10K", 0))
    assert len(pairs) > 20
    for query, positive in pairs:
        assert (
            query.split()[0] in ("What", "How")
            and query.endswith("?")
            and 7 <= len(query.split()) <= 20
        )
        assert len(positive.split()) >= 6 and query not in positive
    headers = {q for q, _ in pairs}
    assert any("Results of Operations" in q or "Net Revenue" in q for q in headers), sorted(
        headers
    )[:20]


def test_line_item_questions_ask_for_a_statements_lines_over_its_page():
    pages = fb.load_pages(ROOT, "BOEING_2022_10K")
    operations = statement_lines(pages[54])  # Consolidated Statements of Operations
    assert operations[:3] == ["Sales of products", "Sales of services", "Total revenues"]
    assert {"Research and development expense, net", "Net loss", "Diluted loss per share"} <= set(
        operations
    )
    assert "Years ended December 31" not in operations  # over the years: a column header
    assert statement_lines(pages[53]) == []  # the statements' index: labels over page numbers
    assert statement_lines(pages[45]) == []  # prose that names a statement
    pairs = line_item_pairs(list(pages), "Boeing", 2022)
    assert ("What was Boeing's total revenues in FY2022?", pages[54]) in pairs
    assert len(pairs) > 100 and {p for _, p in pairs} <= set(pages)
    assert all(q.startswith("What was Boeing's ") and q.endswith(" in FY2022?") for q, _ in pairs)


def test_an_evaluation_question_never_trains_as_a_line_item_question():
    """The builder drops a question the evaluation holds (planted: one of its own questions
    turned into an evaluation question), and on FinanceBench's filings no line-item question,
    nor any (question, page) pair, is one of the 150 questions' (with its evidence pages)."""
    pages = list(fb.load_pages(ROOT, "BOEING_2022_10K"))
    planted = normalized("What was Boeing's  total revenues in FY2022?")
    assert ("What was Boeing's total revenues in FY2022?", pages[54]) not in line_item_pairs(
        pages, "Boeing", 2022, frozenset({planted})
    )
    evaluation = fb.load_questions(ROOT)
    texts = fb.question_texts(ROOT)
    assert texts == {normalized(q.text) for q in evaluation} and len(texts) == 150
    asked = {(normalized(q.text), page) for q in evaluation for page in q.evidence}
    cited = sorted({page.split("#")[0] for q in evaluation for page in q.evidence})
    docs = {d["doc_name"]: d for d in fb.load_documents(ROOT) if d["has_pages"]}
    trained = {
        (normalized(question), fb.page_id(doc, i))
        for doc in cited
        if doc in docs
        for i, page in enumerate(fb.load_pages(ROOT, doc))
        for question, _ in line_item_pairs(
            [page], docs[doc]["company"], docs[doc]["doc_period"], texts
        )
    }
    assert len(trained) > 5000
    assert not {q for q, _ in trained} & texts and not trained & asked


def test_an_unknown_pair_construction_is_refused_before_the_run():
    with pytest.raises(ValueError, match=r"task\.pseudo_queries\.construction must be one of"):
        check(compose(["experiment=fede4rag_paper", "task.pseudo_queries.construction=questions"]))


def test_question_split_and_corpora():
    split = fb.split_questions(ROOT, 50, 100, seed=0)
    assert len(split["valid"]) == 50 and len(split["test"]) == 100
    assert not {q.qid for q in split["valid"]} & {q.qid for q in split["test"]}
    assert split == fb.split_questions(ROOT, 50, 100, seed=0)
    docs = fb.corpus_documents(ROOT, split["valid"], "cited")
    corpus = fb.build_corpus(ROOT, docs)
    assert all(e in corpus for q in split["valid"] for e in q.evidence)
    missing = set((fb.Path(ROOT) / "financebench" / "MISSING_PDFS.txt").read_text().split())
    cited_missing = [q for q in fb.load_questions(ROOT) if q.doc_name in missing]
    assert cited_missing  # documents without PDF text still carry their evidence pages
    gap = fb.build_corpus(ROOT, [cited_missing[0].doc_name])
    assert set(cited_missing[0].evidence) <= set(gap)
    small = fb.build_corpus(
        ROOT, ["3M_2018_10K"], pages_per_doc=3, keep=frozenset({"3M_2018_10K#59"})
    )
    assert list(small) == ["3M_2018_10K#0", "3M_2018_10K#1", "3M_2018_10K#2", "3M_2018_10K#59"]


def test_partitions_are_companies_and_sectors():
    from flwr_datasets.partitioner import NaturalIdPartitioner

    companies = ["AES Corporation", "Boeing"]
    parts = [
        fb.client_documents(ROOT, companies, NaturalIdPartitioner("company"), i) for i in range(2)
    ]
    assert all(d.startswith("AES") for d in parts[0]) and all(
        d.startswith("BOEING") for d in parts[1]
    )
    with pytest.raises(ValueError, match="Procter"):
        fb.document_table(ROOT, ["Procter & Gamble"])
    sectors = NaturalIdPartitioner("gics_sector")
    sectors.dataset = fb.document_table(ROOT, None)
    assert sectors.num_partitions == len(
        {d["gics_sector"] for d in fb.load_documents(ROOT) if d["has_pages"]}
    )


def _features(model, texts):
    return dict(model.tokenize(texts))


def test_kd_loss_is_zero_against_itself_and_the_mse_of_similarities(tiny_encoder):
    from sentence_transformers.util import cos_sim

    from fedsim_tasks.financebench_rag.train import KDInfoNCELoss, frozen_copy

    queries = ["net revenue 2022", "capital expenditure", "dividends paid", "total debt"]
    chunks = ["revenue was 10", "capex rose", "we paid dividends", "debt fell to 3"]
    teacher = frozen_copy(tiny_encoder)
    loss = KDInfoNCELoss(tiny_encoder, temperature=0.5, kd_weight=2.0, teacher=teacher)
    feats = [_features(tiny_encoder, queries), _features(tiny_encoder, chunks)]
    value = loss(feats, None)
    assert loss.last["kd"] == pytest.approx(0.0, abs=1e-10)
    q, p = (tiny_encoder(dict(f))["sentence_embedding"] for f in feats)
    sim = cos_sim(q, p)
    expected_nce = torch.nn.functional.cross_entropy(sim / 0.5, torch.arange(4))
    assert float(value) == pytest.approx(float(expected_nce), rel=1e-5)

    student = frozen_copy(tiny_encoder)  # a moved local model against the same teacher
    with torch.no_grad():
        for param in student.parameters():
            param.add_(0.05 * torch.randn_like(param))
    kd_loss = KDInfoNCELoss(student, temperature=0.5, kd_weight=2.0, teacher=teacher)
    value = kd_loss(feats, None)
    sq, sp = (student(dict(f))["sentence_embedding"] for f in feats)
    expected_kd = torch.mean((cos_sim(sq, sp) - sim) ** 2)
    assert kd_loss.last["kd"] == pytest.approx(float(expected_kd), rel=1e-5)
    assert float(value) == pytest.approx(
        kd_loss.last["infonce"] + 2.0 * float(expected_kd), rel=1e-5
    )


def test_training_moves_only_trainable_weights_and_lowers_the_loss(tiny_encoder):
    from fedsim_tasks.financebench_rag.train import frozen_copy, train_encoder
    from fedsim_tasks.hf import trainable_arrays

    model = frozen_copy(tiny_encoder)
    for p in model.parameters():
        p.requires_grad_(True)
    pairs = [(f"item {i} value {i * 7}", f"the value of item {i} is {i * 7}") for i in range(32)]
    before = trainable_arrays(model)
    first = train_encoder(
        model, pairs, steps=1, batch_size=8, lr=1e-3, temperature=0.1, kd_weight=1.0, seed=0
    )
    later = train_encoder(
        model, pairs, steps=30, batch_size=8, lr=1e-3, temperature=0.1, kd_weight=0.0, seed=0
    )
    assert later["infonce"] < first["infonce"]
    after = trainable_arrays(model)
    assert any(not np.allclose(before[k], after[k]) for k in before)


def test_train_reports_mean_terms_and_the_kd_of_its_first_step(tiny_encoder):
    """kd-first is zero exactly when the student starts from its teacher's weights (both
    without dropout); a student with its own weights, or trained with dropout, starts above."""
    from fedsim_tasks.financebench_rag.train import frozen_copy, train_encoder
    from fedsim_tasks.hf import load_trainable, trainable_arrays

    model = frozen_copy(tiny_encoder)
    for p in model.parameters():
        p.requires_grad_(True)
    pairs = [(f"item {i} value {i * 7}", f"the value of item {i} is {i * 7}") for i in range(32)]
    plain = train_encoder(
        model, pairs, steps=2, batch_size=8, lr=1e-3, temperature=0.1, kd_weight=0.0, seed=0
    )
    assert {"infonce", "loss"} <= set(plain) and "kd" not in plain and "kd-first" not in plain
    noisy = train_encoder(
        frozen_copy(model).requires_grad_(True),
        pairs,
        steps=1,
        batch_size=8,
        lr=1e-3,
        temperature=0.1,
        kd_weight=1.0,
        seed=0,
        dropout=True,
    )
    assert noisy["kd-first"] > 0  # dropout (p=0.1) in the student alone: the old floor
    assert all(m.p > 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))  # restored
    global_model = frozen_copy(model)
    kd = train_encoder(
        model,
        pairs,
        steps=4,
        batch_size=8,
        lr=1e-2,
        temperature=0.1,
        kd_weight=1.0,
        seed=0,
        teacher=global_model,
    )
    assert kd["kd-first"] == pytest.approx(0.0, abs=1e-12)  # the same weights, the same mode
    assert kd["kd"] > 1e-8  # the mean over 4 steps includes steps after the weights moved
    assert kd["loss"] == pytest.approx(kd["infonce"] + kd["kd"], rel=1e-4)  # loss: mean of sums
    own = trainable_arrays(model)  # round 2: the company's own model against the new global
    load_trainable(model, own)
    again = train_encoder(
        model,
        pairs,
        steps=1,
        batch_size=8,
        lr=1e-2,
        temperature=0.1,
        kd_weight=1.0,
        seed=1,
        teacher=global_model,
    )
    assert again["kd-first"] > 1e-8


def test_per_filing_retrieval_searches_only_the_questions_own_filing():
    from fedsim_tasks.financebench_rag.retrieval import evaluate, evaluate_per_filing

    class Fixed:  # question embeddings by text
        def encode(self, texts, **kwargs):
            return np.array([QUESTIONS[t] for t in texts], dtype=np.float32)

    QUESTIONS = {"qa": [1, 0, 0], "qb": [0, 0, 1]}
    ids = ["A#0", "A#1", "A#2", "B#0", "B#1"]
    emb = np.array(
        [[0.6, 0.8, 0], [0.8, 0.6, 0], [0, 0, 1], [1, 0, 0], [0, 0.6, 0.8]], dtype=np.float32
    )
    questions = [
        fb.Question("1", "qa", "c", "A", ("A#1",)),
        fb.Question("2", "qb", "c", "B", ("B#1",)),
    ]
    # shared corpus: qa ranks B#0 (1.0) over A#1 (0.8); qb ranks A#2 (1.0) over B#1 (0.8)
    shared = evaluate(Fixed(), questions, ids, emb)
    assert shared["hit@1"] == 0.0 and shared["mrr@10"] == pytest.approx(0.5)
    # own filing: A holds 3 pages, B 2; each evidence page ranks first there
    own = evaluate_per_filing(Fixed(), questions, ids, emb)
    assert own["hit@1"] == 1.0 and own["mrr@10"] == 1.0
    assert own["precision@5"] == pytest.approx(0.2)  # 1 relevant in the top 5 (of 3 and 2 pages)
    with pytest.raises(ValueError, match="not in their filing B"):
        evaluate_per_filing(Fixed(), [fb.Question("3", "qb", "c", "B", ("A#1",))], ids, emb)


def test_per_filing_corpus_is_exactly_each_filings_pages():
    from fedsim_tasks.financebench_rag.retrieval import score_splits

    class Seeded:
        def encode(self, texts, **kwargs):
            return np.random.default_rng(len(texts)).normal(size=(len(texts), 4)).astype(np.float32)

    questions = fb.split_questions(ROOT, 12, 0, seed=0)
    corpus = fb.build_corpus(ROOT, fb.corpus_documents(ROOT, questions["valid"], "cited"))
    emb = Seeded().encode(list(corpus))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    got = score_splits(Seeded(), ROOT, questions, list(corpus), emb, {}, ["valid"], per_filing=True)
    have = {d["doc_name"] for d in fb.load_documents(ROOT) if d["has_pages"]}
    asked = [q for q in questions["valid"] if q.doc_name in have]
    assert 0 < len(asked) == got["valid-filing/questions"] <= got["valid/questions"] == 12
    # each filing is all its PDF's pages, and nothing else
    assert got["valid-filing/corpus-pages"] == sum(
        len(fb.load_pages(ROOT, d)) for d in {q.doc_name for q in asked}
    )
    assert got["valid/corpus-pages"] == len(corpus)
    assert "valid-filing/ndcg@10" in got and "valid-filing/ndcg@10" not in score_splits(
        Seeded(), ROOT, questions, list(corpus), emb, {}, ["valid"]
    )


def test_passages_cut_pages_and_a_page_scores_as_its_best_passage():
    from fedsim_tasks.financebench_rag.retrieval import (
        _search_pages,
        build_index,
        page_of,
        passages,
    )

    corpus = {"d#0": " ".join(f"w{i}" for i in range(25)), "d#1": "short page", "d#2": ""}
    cut = passages(corpus, words=10, overlap=2)
    assert list(cut) == ["d#0#0", "d#0#1", "d#0#2", "d#1#0", "d#2#0"]
    assert cut["d#0#1"].split()[0] == "w8" and passages(corpus, None, 0) is corpus
    assert {page_of(c) for c in cut} == set(corpus)
    # passages of page 0 rank 1st and 3rd, page 1's 2nd: pages come once, by their best passage
    emb = np.array(
        [[1.0, 0.0], [0.0, 1.0], [0.8, 0.6], [0.9, 0.436], [-1.0, 0.0]], dtype=np.float32
    )
    ranked = _search_pages(
        build_index(emb, "Flat"), np.array([[1.0, 0.0]], np.float32), list(cut), k=2
    )
    assert [p for p, _ in ranked[0]] == ["d#0", "d#1"]
    assert ranked[0][0][1] == pytest.approx(1.0) and ranked[0][1][1] == pytest.approx(0.9)
    pages = _search_pages(
        build_index(emb[:3], "Flat"), np.array([[0.0, 1.0]], np.float32), ["a#0", "a#1", "a#2"], k=2
    )
    assert [p for p, _ in pages[0]] == ["a#1", "a#2"]  # page ids: plain top-k


def test_a_corpus_with_other_texts_under_the_same_ids_gets_its_own_store(tmp_path, tiny_encoder):
    from fedsim_tasks.financebench_rag.retrieval import corpus_store

    plain = {"d#0": "revenue rose", "d#1": "capex fell"}
    titled = {k: f"Boeing FY2022 10K\n{v}" for k, v in plain.items()}
    key = corpus_store(tiny_encoder, "w", plain, tmp_path, 10, "torch").key
    assert key == corpus_store(tiny_encoder, "w", dict(plain), tmp_path, 10, "torch").key
    assert key != corpus_store(tiny_encoder, "w", titled, tmp_path, 10, "torch").key


def test_training_leaves_the_collectors_freeze_as_it_found_it():
    import gc

    from fedsim_tasks.financebench_rag.train import collect_only_new_objects

    frozen = gc.get_freeze_count()
    gc.unfreeze()
    try:
        with collect_only_new_objects():
            assert gc.get_freeze_count() > 0
        assert gc.get_freeze_count() == 0  # nothing stays frozen in a process that froze nothing
        gc.freeze()  # a warm ClientApp's fork: its preloaded heap stays frozen
        with collect_only_new_objects():
            pass
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        if frozen:
            gc.freeze()


def test_the_proximal_term_acts_in_the_retrievers_loop(tiny_encoder):
    """FedProx: the same 4 steps from the same weights move the retriever less at mu 100 than
    without the term, and mu 0 is no term at all (FedAvg's weights to the bit)."""
    from fedsim_tasks.financebench_rag.train import frozen_copy, train_encoder
    from fedsim_tasks.hf import trainable_arrays
    from fedsim_tasks.proximal import ProximalTerm

    pairs = [(f"item {i} value {i * 7}", f"the value of item {i} is {i * 7}") for i in range(32)]
    start = trainable_arrays(frozen_copy(tiny_encoder).requires_grad_(True))
    after = {}
    for mu in (None, 0.0, 100.0):
        model = frozen_copy(tiny_encoder).requires_grad_(True)
        train_encoder(
            model,
            pairs,
            steps=4,
            batch_size=8,
            lr=1e-2,
            temperature=0.1,
            kd_weight=0.0,
            seed=0,
            proximal=None if mu is None else ProximalTerm(model, mu),
        )
        after[mu] = trainable_arrays(model)

    def moved(mu):
        return sum(float(np.linalg.norm(after[mu][k] - start[k])) for k in start)

    assert all(np.array_equal(after[0.0][k], after[None][k]) for k in start)
    assert 0 < moved(100.0) < 0.5 * moved(None)
