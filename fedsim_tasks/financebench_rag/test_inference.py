"""The compiled corpus encoders (OpenVINO, ONNX Runtime) give the torch path's embeddings and
retrieval metrics to float precision, LoRA adapters included; a wrong backend name is refused
before a run starts. The cached encoder (a deployment's evaluation pieces, one process each)
follows the weights: a new graph for new weights, the saved one for the same."""

import copy

import numpy as np
import pytest
from peft import TaskType

from fedsim.config.compose import compose
from fedsim.config.data import resolve_data_root
from fedsim.config.schema import check
from fedsim_tasks.financebench_rag import inference
from fedsim_tasks.financebench_rag.inference import cached_encoder, corpus_encoder
from fedsim_tasks.financebench_rag.retrieval import evaluation_data, score_splits, weights_key
from fedsim_tasks.hf import build_encoder, load_trainable, lora_config, trainable_arrays

ROOT = str(resolve_data_root())
LORA = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["query", "value"]}
TASK = {
    "n_valid": 4,
    "n_test": 6,
    "split_seed": 0,
    "test_corpus": "cited",
    "corpus_pages_per_doc": 3,
}


@pytest.fixture(scope="module")
def trained():
    """The offline MiniLM with LoRA adapters moved away from their init (B = 0 would make them
    a no-op), as after training."""
    model = build_encoder("all-MiniLM-L6-v2", 128, LORA, seed=0)
    rng = np.random.default_rng(0)
    load_trainable(
        model,
        {
            k: (v + rng.normal(0, 0.05, v.shape)).astype(np.float32)
            for k, v in trainable_arrays(model).items()
        },
    )
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
    assert (
        check(
            compose(["experiment=fede4rag_paper", "protocol.eval_backend=openvino_bf16"])
        ).eval_backend
        == "openvino_bf16"
    )


def test_tolerance_sees_the_adapters(trained, slice_, reference):
    """A backend that lost the LoRA update (the base model's embeddings) would fail above."""
    base = corpus_encoder(build_encoder("all-MiniLM-L6-v2", 128, None, seed=0), "torch", 2)(
        slice_[2]
    )
    assert np.abs(base - reference[0]).max() > 1e-2


def test_wrong_backend_is_refused(trained):
    with pytest.raises(
        ValueError,
        match=r"eval_backend='tensorrt' is not one of \['onnx', 'openvino', "
        r"'openvino_bf16', 'torch'\]",
    ):
        check(compose(["experiment=fede4rag_paper", "protocol.eval_backend=tensorrt"]))
    assert check(compose(["experiment=fede4rag_paper"])).eval_backend == "openvino"
    with pytest.raises(ValueError, match="not one of"):
        corpus_encoder(trained, "tensorrt", 1)


PAGES = [
    "Boeing FY2022 10K: revenue rose to 66.6 billion",
    "capital expenditure fell",
    "dividends paid",
    "total debt of 57 billion at year end",
    "a short page",
]


@pytest.fixture
def lora_tiny(tiny_encoder):
    """The tiny encoder with LoRA adapters (merged into the converted graph), fresh per test."""
    model = copy.deepcopy(tiny_encoder)
    model.add_adapter(lora_config(LORA, task_type=TaskType.FEATURE_EXTRACTION))
    return model


def moved(model, scale: float) -> dict:
    """Adapters moved away from their init (B = 0 would make them a no-op), loaded; their digest."""
    rng = np.random.default_rng(int(scale * 100))
    arrays = {
        k: (v + rng.normal(0, scale, v.shape)).astype(np.float32)
        for k, v in trainable_arrays(model).items()
    }
    load_trainable(model, arrays)
    return weights_key("tiny", LORA, arrays)


@pytest.mark.parametrize("backend", ["openvino", "onnx"])
def test_cached_encoder_encodes_the_current_weights(backend, lora_tiny, tmp_path, monkeypatch):
    """Each round's weights get their own encoder: a cache keyed by the model's name (or its
    architecture) would encode round 2's corpus with round 1's weights. The folder keeps the
    current weights' graph only."""
    monkeypatch.setattr(inference, "_latest", None)
    first = cached_encoder(lora_tiny, moved(lora_tiny, 0.5), backend, 1, tmp_path)(PAGES)
    second_key = moved(lora_tiny, 1.0)
    second = cached_encoder(lora_tiny, second_key, backend, 1, tmp_path)(PAGES)
    live = corpus_encoder(lora_tiny, "torch", 1)(PAGES)
    assert np.abs(second - live).max() < 1e-5 < np.abs(first - live).max()
    assert [p.name for p in tmp_path.iterdir()] == [f"{second_key}.{inference.GRAPHS[backend]}"]


def test_a_new_process_compiles_the_saved_graph(lora_tiny, tmp_path, monkeypatch):
    """A deployment's next message runs in a new process: it compiles the graph saved under the
    weights' digest (no conversion: the converter is broken here) and encodes alike to the bit."""
    import openvino

    monkeypatch.setattr(inference, "_latest", None)
    key = moved(lora_tiny, 0.5)
    built = cached_encoder(lora_tiny, key, "openvino", 1, tmp_path)(PAGES)
    monkeypatch.setattr(inference, "_latest", None)  # the next process
    monkeypatch.setattr(openvino, "convert_model", lambda *a, **k: pytest.fail("converted again"))
    assert np.array_equal(cached_encoder(lora_tiny, key, "openvino", 1, tmp_path)(PAGES), built)
    with pytest.raises(pytest.fail.Exception, match="converted again"):  # other weights: converted
        cached_encoder(lora_tiny, moved(lora_tiny, 1.0), "openvino", 1, tmp_path)


def compiled_models(monkeypatch) -> list:
    """Every OpenVINO model compiled from now on (to read its ``LOADED_FROM_CACHE``)."""
    import openvino

    compiled = []

    class Recording(openvino.Core):
        def compile_model(self, *args, **kwargs):
            compiled.append(super().compile_model(*args, **kwargs))
            return compiled[-1]

    monkeypatch.setattr(openvino, "Core", Recording)
    return compiled


def test_a_new_process_imports_the_compiled_graph(lora_tiny, tmp_path, monkeypatch):
    """The next message's process imports the blob OpenVINO's cache kept beside the saved graph
    (no compile) and encodes alike to the bit; the next weights' graph starts without blobs (it
    is compiled, and encodes those weights, as torch does)."""
    compiled = compiled_models(monkeypatch)
    monkeypatch.setattr(inference, "_latest", None)
    key = moved(lora_tiny, 0.5)
    built = cached_encoder(lora_tiny, key, "openvino", 1, tmp_path)(PAGES)
    assert list((tmp_path / f"{key}.openvino" / "compiled").glob("*.blob"))
    monkeypatch.setattr(inference, "_latest", None)  # the next process
    assert np.array_equal(cached_encoder(lora_tiny, key, "openvino", 1, tmp_path)(PAGES), built)
    monkeypatch.setattr(inference, "_latest", None)
    other = cached_encoder(lora_tiny, moved(lora_tiny, 1.0), "openvino", 1, tmp_path)(PAGES)
    assert [c.get_property("LOADED_FROM_CACHE") for c in compiled] == [False, True, False]
    assert np.abs(other - corpus_encoder(lora_tiny, "torch", 1)(PAGES)).max() < 1e-5
