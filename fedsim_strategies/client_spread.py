"""How far apart the clients' models are after local training, recorded around any
weight-averaging Flower strategy.

Client drift is what KD-GLE is meant to damp: each round this wrapper measures, on the
plaintext replies, the mean L2 distance of every client's returned weights to their weighted
average, the mean norm of the client updates (returned minus the global weights sent), and the
norm of the averaged update, and adds them to the round's train metrics. Sampling, weighting and
aggregation stay the wrapped strategy's. Only possible where the server sees plaintext updates
(not under ``HEFedAvg``).
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import Strategy

from fedsim.message_keys import NUM_EXAMPLES


def spread(updated: list[np.ndarray], weights: list[float], start: np.ndarray) -> dict[str, float]:
    """Distances of flat client weight vectors ``updated`` (weighted by ``weights``) from their
    weighted mean and from the ``start`` weights they were trained from."""
    w = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    stack = np.stack(updated).astype(np.float64)
    mean = w @ stack
    distance = float(np.mean(np.linalg.norm(stack - mean, axis=1)))
    update = float(np.mean(np.linalg.norm(stack - start, axis=1)))
    return {"client-distance": distance, "update-norm": update,
            "mean-update-norm": float(np.linalg.norm(mean - start)),
            "relative-distance": distance / update if update else 0.0}


def _flat(arrays: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.ravel() for a in arrays.to_numpy_ndarrays()])


class ClientSpread(Strategy):
    """``strategy`` as it is, plus :func:`spread` of the round's valid replies in its train
    metrics. The spread is taken before the wrapped strategy aggregates, and from a copy of the
    weights sent: Flower's QFedAvg and Bulyan read records with ``keep_input=False``, which
    empties the replies' arrays and the sent weights as they go."""

    def __init__(self, strategy: Strategy):
        self.strategy = strategy
        self.sent: np.ndarray | None = None

    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(self, server_round, arrays, config, grid):
        self.sent = _flat(arrays)
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        stats = self._spread([m.content for m in replies if not m.has_error() and m.content.array_records])
        arrays, metrics = self.strategy.aggregate_train(server_round, replies)
        if arrays is None or stats is None:
            return arrays, metrics
        return arrays, MetricRecord({**(metrics or {}), **stats})

    def _spread(self, valid: list) -> dict[str, float] | None:
        if not valid or self.sent is None:
            return None
        key = getattr(self.strategy, "weighted_by_key", NUM_EXAMPLES)
        weights = [float(next(iter(c.metric_records.values()))[key]) for c in valid]
        return spread([_flat(next(iter(c.array_records.values()))) for c in valid], weights, self.sent)

    def configure_evaluate(self, server_round, arrays, config, grid):
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        return self.strategy.aggregate_evaluate(server_round, replies)
