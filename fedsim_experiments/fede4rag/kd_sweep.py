"""Where KD-GLE matters: local steps x KD weight at one budget per client.

Every cell trains from the same initial model with the same number of optimizer steps per
client, ``budget_steps = local_steps x rounds``: few long rounds let the clients drift from the
global model, which is what KD-GLE penalizes. ``kd_weight`` 0 is FedAvg, above 0 FedE4RAG
(plaintext aggregation unless ``he``; CKKS changes the average by ~1e-8). Each round records the
mean InfoNCE and KD terms over the clients' steps and how far apart the client models are
(``fedsim_strategies.client_spread``). The runners are FedE4RAG's (``protocol.py``), the sweep's
settings and tables in ``settings.py`` and ``report.py``; the grid is config.
"""

from __future__ import annotations

import itertools
import logging

from omegaconf import DictConfig, OmegaConf

from fedsim.privacy.plan import PrivacyPlan
from fedsim.results.outputs import RunOutput
from fedsim.runtime.messaging import Messenger, client_config
from fedsim_experiments.fede4rag import protocol as fede4rag
from fedsim_experiments.fede4rag import report
from fedsim_experiments.fede4rag.settings import cell_name

log = logging.getLogger("fedsim")


def run(
    messenger: Messenger, cfg: DictConfig, out: RunOutput, plan: PrivacyPlan
) -> tuple[dict, str]:
    base = client_config(cfg)
    nodes, info = fede4rag._discover(messenger, base, cfg)
    p = cfg.protocol
    budget = int(p.budget_steps) * len(nodes)
    log.info(
        "[kd-sweep] %d clients; %d steps per client per cell; cells %s x kd %s",
        len(nodes),
        p.budget_steps,
        list(p.local_steps_grid),
        list(p.kd_weights),
    )
    results = {
        "clients": {str(k): v for k, v in sorted(info.items())},
        "budget_steps_per_client": int(p.budget_steps),
        "methods": {},
        "cells": {},
    }
    initial = None
    for name, spec in p.methods.items():  # references (vanilla); null leaves one out
        if spec is None:
            continue
        ctx = fede4rag.Context(messenger, cfg, base, nodes, info, budget, initial, plan=plan)
        results["methods"][name] = fede4rag.train_and_evaluate(ctx, name, spec)
        initial = ctx.initial
    for steps, kd in itertools.product(p.local_steps_grid, p.kd_weights):
        rounds = int(p.budget_steps) // int(steps)
        cell_cfg = OmegaConf.merge(cfg, {"num_rounds": rounds, "protocol": {"local_steps": steps}})
        ctx = fede4rag.Context(messenger, cell_cfg, base, nodes, info, budget, initial, plan=plan)
        name = cell_name(steps, kd)
        spec = {
            "run": "fedsim_experiments.fede4rag.protocol.federated",
            "kd_weight": float(kd),
            "he": bool(p.he),
            "local_models": kd > 0,
        }
        cell = fede4rag.train_and_evaluate(ctx, name, OmegaConf.create(spec))
        results["cells"][name] = {
            "local_steps": int(steps),
            "num_rounds": rounds,
            "kd_weight": float(kd),
            **cell,
        }
        initial = ctx.initial
    return results, report.kd_sweep_summary(results, out)
