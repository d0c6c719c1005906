"""The ``task`` block of FinanceBench retrieval, typed (``conf/task/financebench_rag.yaml``)."""

from __future__ import annotations

from dataclasses import dataclass

from fedsim.config.schema import TaskSettings, require

# pseudo_queries.py
CONSTRUCTIONS = ("inverse_cloze", "unique_inverse_cloze", "headers", "line_item_questions")


@dataclass(frozen=True, kw_only=True)
class PseudoQueries:
    generator: str | None
    construction: str
    chunk_size: int
    chunk_overlap: int
    min_query_words: int
    max_query_words: int
    titles: bool

    def __post_init__(self):
        require(
            self.construction in CONSTRUCTIONS,
            "task.pseudo_queries.construction",
            f"one of {CONSTRUCTIONS}",
            self.construction,
        )


@dataclass(frozen=True, kw_only=True)
class Passages:
    words: int | None
    overlap: int
    titles: bool


@dataclass(frozen=True, kw_only=True)
class HESettings:
    key_dir: str
    poly_modulus_degree: int
    coeff_mod_bit_sizes: list[int]
    global_scale_bits: int


@dataclass(frozen=True, kw_only=True)
class FinanceBenchSettings(TaskSettings):
    units = ("company",)  # a client holds one company's documents
    companies: list[str] | None
    partitioner: dict
    model: str
    max_seq_length: int
    lora: dict | None
    train_dropout: bool
    seed: int
    pages_per_client: int | None
    pseudo_queries: PseudoQueries
    n_valid: int
    n_test: int
    split_seed: int
    test_corpus: str
    corpus_pages_per_doc: int | None
    passages: Passages
    index: str
    embedding_cache: str | None
    he: HESettings
