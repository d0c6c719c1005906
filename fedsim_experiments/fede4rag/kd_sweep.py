"""Where KD-GLE matters: local steps x KD weight at one budget per client.

Every cell trains from the same initial model with the same number of optimizer steps per
client, ``budget_steps = local_steps x rounds``: few long rounds let the clients drift from the
global model, which is what KD-GLE penalizes. ``kd_weight`` 0 is FedAvg, above 0 FedE4RAG
(plaintext aggregation unless ``he``; CKKS changes the average by ~1e-8). Each round records the
mean InfoNCE and KD terms over the clients' steps and how far apart the client models are
(``fedsim_strategies.client_spread``). The runners are FedE4RAG's (``fedsim_experiments.fede4rag``); the grid
is config.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from fedsim.results.outputs import RunOutput, markdown_table, plain_log_scale
from fedsim.runtime.messaging import Messenger, client_config
from fedsim_experiments.fede4rag import protocol as fede4rag
from fedsim_experiments.fede4rag.report import scored_in
from fedsim_experiments.fede4rag.settings import FedE4RAGProtocol

log = logging.getLogger("fedsim")


@dataclass(frozen=True, kw_only=True)
class KDSweepProtocol(FedE4RAGProtocol):
    """The sweep's settings (``conf/experiment/fede4rag_kd_sweep.yaml``)."""
    budget_steps: int  # optimizer steps per client in every cell (local_steps x rounds)
    local_steps_grid: list[int]
    """local steps per round of the cells; each must divide budget_steps"""
    kd_weights: list[float]
    """KD-GLE weights of the cells (0 = FedAvg)"""
    he: bool           # aggregate the cells under CKKS (HEFedAvg): no client distance then

    def he_methods(self) -> list[str]:
        return [cell_name(s, k) for s in self.local_steps_grid for k in self.kd_weights] if self.he else []

    def __post_init__(self):
        super().__post_init__()  # eval_backend, eval_nodes
        if self.budget_steps < 1:
            raise ValueError(f"budget_steps must be >= 1, got {self.budget_steps}")
        if not self.local_steps_grid or not self.kd_weights:
            raise ValueError("local_steps_grid and kd_weights must name at least one value")
        bad = [s for s in self.local_steps_grid if s < 1 or self.budget_steps % s]
        if bad:
            raise ValueError(f"local_steps_grid {bad}: each must be >= 1 and divide "
                             f"budget_steps={self.budget_steps}")
        if any(k < 0 for k in self.kd_weights):
            raise ValueError(f"kd_weights must be >= 0, got {self.kd_weights}")
        if len(set(self.local_steps_grid)) < len(self.local_steps_grid) or \
                len(set(self.kd_weights)) < len(self.kd_weights):
            raise ValueError("local_steps_grid and kd_weights must not repeat a value")


def cell_name(steps: int, kd: float) -> str:
    return f"steps{steps}_kd{kd:g}"


def run(messenger: Messenger, cfg: DictConfig, out: RunOutput) -> tuple[dict, str]:
    base = client_config(cfg)
    nodes, info = fede4rag._discover(messenger, base, cfg)
    p = cfg.protocol
    budget = int(p.budget_steps) * len(nodes)
    log.info("[kd-sweep] %d clients; %d steps per client per cell; cells %s x kd %s", len(nodes),
             p.budget_steps, list(p.local_steps_grid), list(p.kd_weights))
    results = {"clients": {str(k): v for k, v in sorted(info.items())},
               "budget_steps_per_client": int(p.budget_steps), "methods": {}, "cells": {}}
    initial = None
    for name, spec in p.methods.items():  # references (vanilla); null leaves one out
        if spec is None:
            continue
        ctx = fede4rag.Context(messenger, cfg, base, nodes, info, budget, initial)
        results["methods"][name] = fede4rag.train_and_evaluate(ctx, name, spec)
        initial = ctx.initial
    for steps, kd in itertools.product(p.local_steps_grid, p.kd_weights):
        rounds = int(p.budget_steps) // int(steps)
        cell_cfg = OmegaConf.merge(cfg, {"num_rounds": rounds, "protocol": {"local_steps": steps}})
        ctx = fede4rag.Context(messenger, cell_cfg, base, nodes, info, budget, initial)
        name = cell_name(steps, kd)
        spec = {"run": "fedsim_experiments.fede4rag.protocol.federated", "kd_weight": float(kd), "he": bool(p.he),
                "local_models": kd > 0}
        cell = fede4rag.train_and_evaluate(ctx, name, OmegaConf.create(spec))
        results["cells"][name] = {"local_steps": int(steps), "num_rounds": rounds,
                                  "kd_weight": float(kd), **cell}
        initial = ctx.initial
    return results, _summary(results, out)


TERMS = ("infonce", "kd", "kd-first", "client-distance", "update-norm", "relative-distance")


def _last_round(cell: dict) -> dict:
    rounds = cell.get("rounds", {})
    return rounds[max(rounds)] if rounds else {}


def _summary(r: dict, out: RunOutput) -> str:
    every = {**r["methods"], **r["cells"]}
    labels = scored_in(next(iter(every.values())))
    rows = []
    for name, m in every.items():
        row = {"cell": name, "steps x rounds": f"{m['local_steps']} x {m['num_rounds']}"
               if "local_steps" in m else "-", "kd weight": m.get("kd_weight", "-")}
        for label in labels:
            row |= {f"{label} {k}": m[label][k] for k in ("ndcg@10", "hit@1", "hit@10")}
        last = _last_round(m) if "local_steps" in m else {}
        row |= {t: f"{last[t]:.3g}" if t in last else "" for t in TERMS}
        rows.append(row)
    columns = list(rows[0])
    first = next(iter(every.values()))
    corpora = "; ".join(f"{label}: {first[label]['questions']} questions, "
                        f"{first[label]['corpus_pages']} pages" for label in labels)
    _plot(r, out)
    return (f"# FedE4RAG: local steps x KD weight\n\n{r['budget_steps_per_client']} optimizer steps "
            f"per client in every cell ({corpora}; `-filing`: each question searches its own "
            f"filing). Last round's means over the clients' steps: InfoNCE, KD term (unweighted; "
            f"kd-first: the first step's, same weights as the teacher), client distance (mean "
            f"L2 of each client's weights to their average), update norm, their ratio.\n\n"
            + markdown_table(rows, columns) + "\n")


def _plot(r: dict, out: RunOutput) -> None:
    """Per cell, by optimizer steps done: the KD term and the client distance each round."""
    for term, what in (("kd", "KD term (mean over the round's steps)"),
                       ("client-distance", "client distance (mean L2 to their average)")):
        fig, ax, save = out.figure(f"{term}_by_round")
        for name, cell in r["cells"].items():
            rounds = sorted(cell.get("rounds", {}))
            y = [cell["rounds"][k].get(term) for k in rounds]
            if rounds and all(v is not None for v in y):
                ax.plot([k * cell["local_steps"] for k in rounds], y, marker="o", label=name)
        ax.set_xlabel("optimizer steps per client")
        ax.set_ylabel(what)
        plain_log_scale(ax)
        ax.legend(fontsize=6)
        save()
