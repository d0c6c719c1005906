"""The tiny sentence encoder the retriever's tests build (no download, seconds to convert)."""

import pytest
import torch


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A 2-layer BERT sentence encoder with MiniLM's tokenizer, random weights, built here."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    from fedsim_tasks.hf import resolve_model

    path = tmp_path_factory.mktemp("tiny")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2"))
    torch.manual_seed(0)
    BertModel(
        BertConfig(
            vocab_size=tokenizer.vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
        )
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    word = Transformer(str(path), max_seq_length=32)
    return SentenceTransformer(
        modules=[word, Pooling(word.get_embedding_dimension())], device="cpu"
    )
