"""The compiled corpus encoders (OpenVINO, ONNX Runtime) give the torch path's embeddings and
retrieval metrics to float precision, LoRA adapters included; a wrong backend name is refused
before a run starts."""

import numpy as np
import pytest

from fedsim.config import compose
from fedsim.data import resolve_data_root
from fedsim.schema import check
from fedsim_tasks.financebench_rag.inference import corpus_encoder
from fedsim_tasks.financebench_rag.retrieval import evaluation_data, score_splits
from fedsim_tasks.hf import build_encoder, load_trainable, trainable_arrays

ROOT = str(resolve_data_root())
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["query", "value"]}
TASK = {"n_valid": 4, "n_test": 6, "split_seed": 0, "test_corpus": "cited", "corpus_pages_per_doc": 3}


@pytest.fixture(scope="module")
def trained():
    """The offline MiniLM with LoRA adapters moved away from their init (B = 0 would make them
    a no-op), as after training."""
    model = build_encoder("all-MiniLM-L6-v2", 128, LORA, seed=0)
    rng = np.random.default_rng(0)
    load_trainable(model, {k: (v + rng.normal(0, 0.05, v.shape)).astype(np.float32)
                           for k, v in trainable_arrays(model).items()})
    return model


@pytest.fixture(scope="module")
def slice_():
    questions, corpus = evaluation_data(ROOT, TASK)
    return questions, list(corpus), list(corpus.values())


@pytest.fixture(scope="module")
def reference(trained, slice_):
    questions, ids, texts = slice_
    emb = corpus_encoder(trained, "torch", 2)(texts)
    return emb, score_splits(trained, ROOT, questions, ids, emb, TASK, ["valid", "test"])


@pytest.mark.parametrize("backend", ["openvino", "onnx"])
def test_compiled_backend_matches_torch(backend, trained, slice_, reference):
    questions, ids, texts = slice_
    emb = corpus_encoder(trained, backend, 2)(texts)
    ref_emb, ref_metrics = reference
    assert emb.shape == ref_emb.shape == (len(texts), 384) and emb.dtype == np.float32
    assert np.abs(emb - ref_emb).max() < 1e-5
    assert (emb * ref_emb).sum(axis=1).min() > 1 - 1e-6
    metrics = score_splits(trained, ROOT, questions, ids, emb, TASK, ["valid", "test"])
    assert metrics.keys() == ref_metrics.keys()
    assert all(metrics[k] == pytest.approx(ref_metrics[k], abs=1e-9) for k in metrics)


def test_bf16_backend_is_close_but_opt_in(trained, slice_, reference):
    """``openvino_bf16`` keeps the adapters and the embedding's direction (cosine > 0.999) but
    not float32 precision; the default stays float32."""
    emb = corpus_encoder(trained, "openvino_bf16", 2)(slice_[2])
    assert emb.shape == reference[0].shape and emb.dtype == np.float32
    assert (emb * reference[0]).sum(axis=1).min() > 0.999
    assert check(compose(["experiment=fede4rag_paper", "protocol.eval_backend=openvino_bf16"])).eval_backend \
        == "openvino_bf16"


def test_tolerance_sees_the_adapters(trained, slice_, reference):
    """A backend that lost the LoRA update (the base model's embeddings) would fail above."""
    base = corpus_encoder(build_encoder("all-MiniLM-L6-v2", 128, None, seed=0), "torch", 2)(slice_[2])
    assert np.abs(base - reference[0]).max() > 1e-2


def test_wrong_backend_is_refused(trained):
    with pytest.raises(ValueError, match=r"eval_backend='tensorrt' is not one of \['onnx', 'openvino', "
                                         r"'openvino_bf16', 'torch'\]"):
        check(compose(["experiment=fede4rag_paper", "protocol.eval_backend=tensorrt"]))
    assert check(compose(["experiment=fede4rag_paper"])).eval_backend == "openvino"
    with pytest.raises(ValueError, match="not one of"):
        corpus_encoder(trained, "tensorrt", 1)
