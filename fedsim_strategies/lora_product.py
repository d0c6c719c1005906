"""LoRA adapters averaged by their product, around a weight-averaging Flower strategy.

A LoRA layer adds ``B @ A`` (times a constant scale) to a frozen weight. Averaging the factors
apart gives ``mean(B) @ mean(A)``, which is not ``mean(B @ A)``: the cross terms of different
clients enter, and the gap grows as the clients' adapters drift apart (persistent local
models). Here each adapter pair of the aggregate is replaced by the weighted mean of the
clients' products, re-factored to the adapters' rank by a truncated SVD
(``B' = U_r sqrt(S_r)``, ``A' = sqrt(S_r) V_r^T``): exact where that mean has rank at most r,
its best rank-r approximation (Eckart-Young) otherwise. Written here because peft merges one
adapter into its base weights but does not average several adapters' products.
Every other array stays the wrapped strategy's aggregate. Needs plaintext updates (not under HE
or a DP wrapper: the product is not linear in what they add).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.serverapp.strategy import Strategy

from fedsim.message_keys import NUM_EXAMPLES
from fedsim.runtime.records import from_record
from fedsim_strategies.wrapper import StrategyWrapper

A_MARK, B_MARK = "lora_A", "lora_B"


def product_average(
    clients: list[dict[str, np.ndarray]], weights: list[float]
) -> dict[str, np.ndarray]:
    """Each ``lora_A`` / ``lora_B`` pair of the clients' arrays replaced by the rank-r factors
    of the weighted mean of ``B @ A``; the other arrays are left out (the caller keeps its
    own)."""
    w = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    out = {}
    for a_name in (k for k in clients[0] if A_MARK in k):
        b_name = a_name.replace(A_MARK, B_MARK)
        rank = clients[0][a_name].shape[0]
        delta = sum(
            wi * (c[b_name].astype(np.float64) @ c[a_name].astype(np.float64))
            for wi, c in zip(w, clients)
        )
        u, s, vt = np.linalg.svd(delta, full_matrices=False)
        root = np.sqrt(s[:rank])
        out[b_name] = (u[:, :rank] * root).astype(clients[0][b_name].dtype)
        out[a_name] = (root[:, None] * vt[:rank]).astype(clients[0][a_name].dtype)
    return out


class LoraProductAvg(StrategyWrapper):
    """``strategy``'s aggregate with every LoRA pair replaced by :func:`product_average` of the
    round's valid replies, weighted as the wrapped strategy weights them."""

    def __init__(self, strategy: Strategy):
        self.strategy = strategy
        self.weighted_by_key = getattr(strategy, "weighted_by_key", NUM_EXAMPLES)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        valid = [m.content for m in replies if not m.has_error() and m.content.array_records]
        weights = [
            float(next(iter(c.metric_records.values()))[self.weighted_by_key]) for c in valid
        ]
        clients = [from_record(next(iter(c.array_records.values()))) for c in valid]  # before the
        # wrapped strategy reads them (Flower's QFedAvg and Bulyan empty the records they read)
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if arrays is None or not valid:
            return arrays, metrics
        merged = product_average(clients, weights)
        return ArrayRecord(
            {k: Array(merged[k]) if k in merged else v for k, v in arrays.items()}
        ), metrics
