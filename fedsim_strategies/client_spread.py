"""How far apart the clients' models are after local training, recorded around any
weight-averaging Flower strategy.

Client drift is what KD-GLE is meant to damp: each round this wrapper measures, on the
plaintext replies, the mean L2 distance of every client's returned weights to their weighted
average, the mean norm of the client updates (returned minus the global weights sent), and the
norm of the averaged update, and adds them to the round's train metrics. Sampling, weighting and
aggregation stay the wrapped strategy's. Only possible where the server sees plaintext updates
(not under ``HEFedAvg``).

LoRA factors are not where a model is: ``B R`` and ``R^-1 A`` compute what ``B`` and ``A`` do, and
``LoraProductAvg`` re-factors the aggregate by an SVD, which can put it far from every client in
factor space while its adapters add what theirs add on average. So with LoRA pairs the same
distances are also taken on what each pair adds (``B @ A``, before peft's constant scale): the
``delta-`` keys.
"""

from __future__ import annotations

import numpy as np
from flwr.app import MetricRecord
from flwr.serverapp.strategy import Strategy

from fedsim.message_keys import NUM_EXAMPLES
from fedsim.runtime.records import from_record
from fedsim_strategies.lora_product import A_MARK, B_MARK
from fedsim_strategies.wrapper import StrategyWrapper


def _spread_of_blocks(blocks, weights: list[float]) -> dict[str, float]:
    """Distances of the client models (weighted by ``weights``) from their weighted mean and from
    the ``start`` weights they were trained from, given block by block, ``(clients x ... stack,
    start)``: the squared distances add up over blocks, so no whole model is stacked at once."""
    w = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    to_mean, to_start, mean_to_start = np.zeros(len(w)), np.zeros(len(w)), 0.0
    for stack, start in blocks:
        stack = stack.reshape(len(w), -1).astype(np.float64)
        start = np.asarray(start, dtype=np.float64).ravel()
        mean = w @ stack
        to_mean += np.sum((stack - mean) ** 2, axis=1)
        to_start += np.sum((stack - start) ** 2, axis=1)
        mean_to_start += float(np.sum((mean - start) ** 2))
    distance, update = float(np.mean(np.sqrt(to_mean))), float(np.mean(np.sqrt(to_start)))
    return {
        "client-distance": distance,
        "update-norm": update,
        "mean-update-norm": float(np.sqrt(mean_to_start)),
        "relative-distance": distance / update if update else 0.0,
    }


def _delta(arrays: dict[str, np.ndarray], a_name: str) -> np.ndarray:
    """What a LoRA pair adds to its frozen weight, ``B @ A`` (before peft's constant scale)."""
    b = arrays[a_name.replace(A_MARK, B_MARK)]
    return b.astype(np.float64) @ arrays[a_name].astype(np.float64)


def model_spread(
    updated: list[dict[str, np.ndarray]], weights: list[float], start: dict[str, np.ndarray]
) -> dict[str, float]:
    """How far apart the named weights are as they travel and, where they hold LoRA pairs, of
    what the model adds (each pair as ``B @ A``, other arrays as they are) under ``delta-`` keys,
    with :func:`factor_average_gap`."""
    stats = _spread_of_blocks(
        ((np.stack([u[k] for u in updated]), start[k]) for k in start), weights
    )
    pairs = [k for k in start if A_MARK in k]
    if pairs:
        blocks = (
            (np.stack([_delta(u, k) for u in updated]), _delta(start, k))
            if k in pairs
            else (np.stack([u[k] for u in updated]), start[k])
            for k in start
            if B_MARK not in k
        )
        stats |= {f"delta-{k}": v for k, v in _spread_of_blocks(blocks, weights).items()}
        stats["delta-factor-average-gap"] = factor_average_gap(updated, weights, pairs)
    return stats


def factor_average_gap(
    updated: list[dict[str, np.ndarray]], weights: list[float], pairs: list[str]
) -> float:
    """How far averaging each LoRA factor apart lands from the average of what the clients'
    pairs add: ||mean(B) @ mean(A) - mean(B @ A)|| / ||mean(B @ A)|| over the ``pairs`` (named by
    their A), 0 for one client or clients whose pairs agree."""
    w = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    gap, norm = 0.0, 0.0
    for a_name in pairs:
        b_name = a_name.replace(A_MARK, B_MARK)
        mean_factors = {
            k: sum(wi * u[k].astype(np.float64) for wi, u in zip(w, updated))
            for k in (a_name, b_name)
        }
        product_mean = sum(wi * _delta(u, a_name) for wi, u in zip(w, updated))
        gap += float(np.sum((_delta(mean_factors, a_name) - product_mean) ** 2))
        norm += float(np.sum(product_mean**2))
    return float(np.sqrt(gap / norm)) if norm else 0.0


class ClientSpread(StrategyWrapper):
    """``strategy`` as it is, plus :func:`model_spread` of the round's valid replies in its train
    metrics. The spread is taken before the wrapped strategy aggregates, and from a copy of the
    weights sent: Flower's QFedAvg and Bulyan read records with ``keep_input=False``, which
    empties the replies' arrays and the sent weights as they go."""

    def __init__(self, strategy: Strategy):
        self.strategy = strategy
        self.sent: dict[str, np.ndarray] | None = None

    def configure_train(self, server_round, arrays, config, grid):
        self.sent = from_record(arrays)  # fresh arrays: what QFedAvg empties is the record
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        stats = self._spread(
            [m.content for m in replies if not m.has_error() and m.content.array_records]
        )
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if arrays is None or stats is None:
            return arrays, metrics
        return arrays, MetricRecord({**(metrics or {}), **stats})

    def _spread(self, valid: list) -> dict[str, float] | None:
        if not valid or self.sent is None:
            return None
        key = getattr(self.strategy, "weighted_by_key", NUM_EXAMPLES)
        weights = [float(next(iter(c.metric_records.values()))[key]) for c in valid]
        return model_spread(
            [from_record(next(iter(c.array_records.values()))) for c in valid], weights, self.sent
        )
