"""Whether KD-GLE acts under an objective: the KD / InfoNCE gradient-norm ratio on real weights.

One company's retriever (``task.companies``, its first ``task.pages_per_client`` pages; MiniLM +
LoRA as ``fede4rag_paper`` builds it) trains ``warm`` InfoNCE steps from the common initial
model (temperature 0.05, no KD: a local model drifted from the global), then takes one step
under each objective with the initial model as KD's frozen teacher; the step's
``kd-grad-ratio`` (``fedsim_tasks/financebench_rag/train.py``) is the norm of the weighted KD
term's gradient over InfoNCE's. One torch thread, in this process (no Flower run).

    .venv/bin/python bench/fede4rag_kd_ratio.py [--warm 6 24] [overrides ...]
"""

from __future__ import annotations

import argparse
import copy

import torch
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim_clients.retriever import RetrieverClient
from fedsim_tasks.financebench_rag.train import frozen_copy, train_encoder

OBJECTIVES = {
    "weak (fede4rag_weak_kd)": (0.05, 1.0),
    "authors' (fede4rag_paper)": (1.0, 100.0),
}  # temperature, KD


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--warm", type=int, nargs="+", default=[6, 24], help="InfoNCE steps before the measured one"
    )
    parser.add_argument(
        "overrides", nargs="*", help="config overrides (default: AES, its first 40 pages)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    InProcessGrid({})  # this process plays the run (message metadata needs a run id)
    cfg = compose(
        [
            "experiment=fede4rag_paper",
            "task.companies=[AES Corporation]",
            "task.pages_per_client=40",
            *args.overrides,
        ]
    )
    p = cfg.protocol
    client = RetrieverClient(OmegaConf.to_container(cfg.task, resolve=True), cfg.data_root, 0, 1)
    teacher = frozen_copy(client.model)
    for warm in args.warm:
        student = copy.deepcopy(client.model)
        train_encoder(student, client.pairs, warm, p.batch_size, p.lr, 0.05, 0.0, seed=0)
        for name, (temperature, kd) in OBJECTIVES.items():
            step = train_encoder(
                copy.deepcopy(student),
                client.pairs,
                1,
                p.batch_size,
                p.lr,
                temperature,
                kd,
                seed=1,
                teacher=teacher,
            )
            print(
                f"after {warm} InfoNCE steps, {name}: temperature {temperature}, KD x{kd:g}: "
                f"kd-grad-ratio {step['kd-grad-ratio']:.4g} (KD term {step['kd']:.3g}, "
                f"InfoNCE {step['infonce']:.3g})",
                flush=True,
            )


if __name__ == "__main__":
    main()
