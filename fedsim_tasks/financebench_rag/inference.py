"""Corpus encoders for evaluation: the sentence-transformers model on torch, or the same weights
compiled for OpenVINO or ONNX Runtime, float32 throughout (bench/fede4rag_eval.py measures the
speed and checks the metrics against torch).

sentence-transformers' own ``backend="openvino"|"onnx"`` needs optimum, whose releases pin
other transformers / torch versions than this project's; so the model is converted here with
the runtimes' own converters. LoRA adapters are merged into a copy's base weights first (peft's
``merge``), so the compiled graph is plain BERT. Tokenization stays the model's own.

Converting is the expensive part (tracing the merged model: 4-20 s for MiniLM on the 2-core
CPU, against ~1 s to compile the saved graph and 0.06 s to read it; ``docs/benchmarks/deployment.md``),
so the converted graph is always written to a file and compiled from there, and
:func:`cached_encoder` keeps that file on the client's disk under the digest of the weights it
was converted from: a deployment runs every message in a new process (Flower's contract; a warm
process's forks share nothing back), so an evaluation's later pieces, each one message, compile
the saved graph instead of converting again (OpenVINO: import the compiled blob OpenVINO's own
cache keeps beside it, :func:`_compiled_cache`). Keyed by the weights' digest, not by the model's
name or the architecture: the weights change every round and are baked into the graph's
constants, so a graph kept by structure alone would encode with an earlier round's weights.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
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
        return model.encode(
            texts,
            batch_size=32,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        ).astype(np.float32)

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

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        return self.model(features)["sentence_embedding"]


def _batches(
    model, run: Callable[[dict[str, np.ndarray]], np.ndarray], batch_size: int = 32
) -> Encode:
    """Longest texts first (as sentence-transformers does, so batches pad little), the model's
    tokenizer, ``run`` on each batch, rows back in input order, normalized."""

    def encode(texts: list[str]) -> np.ndarray:
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), model.get_embedding_dimension()), np.float32)
        for start in range(0, len(texts), batch_size):
            rows = order[start : start + batch_size]
            features = model.preprocess([texts[i] for i in rows])
            out[rows] = run({k: features[k].numpy() for k in _INPUTS if k in features})
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    return encode


_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # _Embedder.forward's order


def _example(model) -> dict[str, torch.Tensor]:
    features = model.preprocess(["an example page", "a second, longer example page to trace"])
    return {k: features[k] for k in _INPUTS if k in features}


def _openvino(model, threads: int, graph: Path, precision: str = "f32") -> Encode:
    import openvino as ov

    if not (graph / "model.xml").is_file():
        with torch.no_grad():
            converted = ov.convert_model(_Embedder(model), example_input=_example(model))
        _write_folder(
            graph,
            lambda folder: ov.save_model(converted, folder / "model.xml", compress_to_fp16=False),
        )
    # the precision explicitly: on CPUs with bf16 units OpenVINO would otherwise compute in bf16;
    # no thread pinning: two encoding processes on one machine (protocol.eval_nodes) each pinned
    # their threads to the same cores and ran at half speed (measured: 15.7 s vs 7.9 s)
    compiled = ov.Core().compile_model(
        str(graph / "model.xml"),
        "CPU",
        {
            "INFERENCE_PRECISION_HINT": precision,
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
            "ENABLE_CPU_PINNING": False,
            **_compiled_cache(graph),
        },
    )
    request = compiled.create_infer_request()
    return _batches(model, lambda features: request.infer(features)[0].copy())


def _compiled_cache(graph: Path) -> dict[str, str]:
    """OpenVINO's own cache of compiled models (``CACHE_DIR``), inside the graph's folder: a new
    process (each message of a deployment) imports the compiled blob instead of compiling the
    graph again (0.7-0.9 s against 1.3-1.5 s for MiniLM on the busy 2-core CPU). OpenVINO names
    a blob by the graph file's path and the compile options; in the folder of one weights digest,
    the blobs are that graph's only and are removed with it (OpenVINO 2026.4 also compiled, not
    imported, a graph of other weights saved under a cached path: checked by hand).
    ``OPTIMIZE_SIZE``: the blob holds no weights (0.4 MB, not 90 MB), they are mapped from the
    graph's own ``model.bin``."""
    return {"CACHE_DIR": str(graph / "compiled"), "CACHE_MODE": "OPTIMIZE_SIZE"}


def _onnx(model, threads: int, graph: Path) -> Encode:
    import onnxruntime as ort

    example = _example(model)
    names = list(example)
    if not (graph / "model.onnx").is_file():
        with torch.no_grad():
            _write_folder(
                graph,
                lambda folder: torch.onnx.export(
                    _Embedder(model),
                    (),
                    str(folder / "model.onnx"),
                    kwargs=example,
                    input_names=names,
                    output_names=["embedding"],
                    dynamo=False,
                    dynamic_axes={n: {0: "batch", 1: "tokens"} for n in names}
                    | {"embedding": {0: "batch"}},
                ),
            )
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(
        str(graph / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    return _batches(model, lambda features: session.run(None, features)[0])


def _write_folder(folder: Path, write: Callable[[Path], None]) -> None:
    """``write`` into a new folder beside ``folder``, renamed to it whole: a reader (another
    process of the node) sees the complete graph or none. One written meanwhile is kept."""
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    write(partial)
    try:
        os.rename(partial, folder)
    except OSError:  # another process wrote the same graph first
        shutil.rmtree(partial, ignore_errors=True)


BACKENDS: dict[str, Callable[..., Encode]] = {
    "torch": _torch,
    "openvino": _openvino,
    "onnx": _onnx,
    "openvino_bf16": functools.partial(_openvino, precision="bf16"),
}
"""``protocol.eval_backend`` name -> builder(model, threads[, graph folder]) of the corpus encoder.
``openvino_bf16`` computes in bfloat16 (CPUs with avx512_bf16 / AMX; emulated, slower, elsewhere):
not float32 noise, so opt-in, its metric differences measured by bench/fede4rag_eval.py."""
GRAPHS = {"openvino": "openvino", "openvino_bf16": "openvino", "onnx": "onnx"}
"""compiled backend -> the format of its converted graph (bf16 is a compile option of the same graph)"""


def _build(model, backend: str, threads: int, graph: Path) -> Encode:
    if backend not in BACKENDS:
        raise ValueError(f"inference backend {backend!r} is not one of {sorted(BACKENDS)}")
    return (
        BACKENDS[backend](model, threads, graph)
        if backend in GRAPHS
        else BACKENDS[backend](model, threads)
    )


def corpus_encoder(model, backend: str, threads: int) -> Encode:
    """An encoder of the model's current weights, built now (a compiled backend is a frozen copy,
    its graph converted into a temporary folder: build a new one after loading other weights)."""
    with tempfile.TemporaryDirectory() as folder:
        return _build(model, backend, threads, Path(folder) / "graph")


_latest: tuple[tuple, Encode] | None = None
"""this process's last compiled encoder: (weights digest, backend, threads, max_seq_length), encoder"""


def cached_encoder(model, weights: str, backend: str, threads: int, folder: Path) -> Encode:
    """The encoder of ``model``, whose current weights have the digest ``weights``
    (``retrieval.weights_key``): kept in this process for the next piece of the same evaluation,
    its converted graph kept in ``folder`` (the client's own, on its disk) for the next process;
    the graphs of other weights there are removed (one per client). The torch backend encodes
    with the live model: nothing to build or keep."""
    global _latest  # pylint: disable=global-statement
    if backend not in GRAPHS:
        return _build(model, backend, threads, folder)
    key = (weights, backend, threads, model.max_seq_length)
    if _latest is None or _latest[0] != key:
        _latest = None  # the earlier encoder's memory is freed before this one is built
        graph = Path(folder) / f"{weights}.{GRAPHS[backend]}"
        graph.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        for old in graph.parent.iterdir():
            if old.name != graph.name:
                shutil.rmtree(old, ignore_errors=True)
        _latest = key, _build(model, backend, threads, graph)
    return _latest[1]
