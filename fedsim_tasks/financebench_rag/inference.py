"""Corpus encoders for evaluation: the sentence-transformers model on torch, or the same weights
compiled for OpenVINO or ONNX Runtime, float32 throughout (bench/fede4rag_eval.py measures the
speed and checks the metrics against torch).

sentence-transformers' own ``backend="openvino"|"onnx"`` needs optimum, whose releases pin
other transformers / torch versions than this project's; so the model is converted here with
the runtimes' own converters. LoRA adapters are merged into a copy's base weights first (peft's
``merge``), so the compiled graph is plain BERT. Tokenization stays the model's own.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

Encode = Callable[[list[str]], np.ndarray]
"""Texts -> normalized float32 embeddings, one row per text."""


def _torch(model, threads: int) -> Encode:
    def encode(texts: list[str]) -> np.ndarray:
        torch.set_num_threads(threads)
        return model.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True,
                            show_progress_bar=False).astype(np.float32)
    return encode


class _Embedder(torch.nn.Module):
    """The sentence-transformers pipeline (transformer, pooling, normalize) as a module of
    tensors, with LoRA merged into a copy of the base weights: what the converters trace."""

    def __init__(self, model):
        super().__init__()
        from peft.tuners.tuners_utils import BaseTunerLayer
        self.model = copy.deepcopy(model).cpu().eval()  # the compiled backends run on the CPU
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                module.merge()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        return self.model(features)["sentence_embedding"]


def _batches(model, run: Callable[[dict[str, np.ndarray]], np.ndarray], batch_size: int = 32) -> Encode:
    """Longest texts first (as sentence-transformers does, so batches pad little), the model's
    tokenizer, ``run`` on each batch, rows back in input order, normalized."""
    def encode(texts: list[str]) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), model.get_embedding_dimension()), np.float32)
        for start in range(0, len(texts), batch_size):
            rows = order[start:start + batch_size]
            features = model.preprocess([texts[i] for i in rows])
            out[rows] = run({k: features[k].numpy() for k in _INPUTS if k in features})
        return out / np.linalg.norm(out, axis=1, keepdims=True)
    return encode


_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # _Embedder.forward's order


def _example(model) -> dict[str, torch.Tensor]:
    features = model.preprocess(["an example page", "a second, longer example page to trace"])
    return {k: features[k] for k in _INPUTS if k in features}


def _openvino(model, threads: int, precision: str = "f32") -> Encode:
    import openvino as ov
    with torch.no_grad():
        graph = ov.convert_model(_Embedder(model), example_input=_example(model))
    # the precision explicitly: on CPUs with bf16 units OpenVINO would otherwise compute in bf16;
    # no thread pinning: two encoding processes on one machine (protocol.eval_nodes) each pinned
    # their threads to the same cores and ran at half speed (measured: 15.7 s vs 7.9 s)
    compiled = ov.Core().compile_model(graph, "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                      "INFERENCE_NUM_THREADS": threads,
                                                      "PERFORMANCE_HINT": "LATENCY",
                                                      "ENABLE_CPU_PINNING": False})
    request = compiled.create_infer_request()
    return _batches(model, lambda features: request.infer(features)[0].copy())


def _onnx(model, threads: int) -> Encode:
    import onnxruntime as ort
    example = _example(model)
    names = list(example)
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        path = Path(folder) / "model.onnx"
        torch.onnx.export(_Embedder(model), (), str(path), kwargs=example, input_names=names,
                          output_names=["embedding"], dynamo=False,
                          dynamic_axes={n: {0: "batch", 1: "tokens"} for n in names} | {"embedding": {0: "batch"}})
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return _batches(model, lambda features: session.run(None, features)[0])


BACKENDS: dict[str, Callable[[object, int], Encode]] = {
    "torch": _torch, "openvino": _openvino, "onnx": _onnx,
    "openvino_bf16": functools.partial(_openvino, precision="bf16")}
"""``protocol.eval_backend`` name -> builder(model, threads) of the corpus encoder.
``openvino_bf16`` computes in bfloat16 (CPUs with avx512_bf16 / AMX; emulated, slower, elsewhere):
not float32 noise, so opt-in, its metric differences measured by bench/fede4rag_eval.py."""


def corpus_encoder(model, backend: str, threads: int) -> Encode:
    """An encoder of the model's current weights (a compiled backend is a frozen copy: build a
    new one after loading other weights)."""
    if backend not in BACKENDS:
        raise ValueError(f"inference backend {backend!r} is not one of {sorted(BACKENDS)}")
    return BACKENDS[backend](model, threads)
