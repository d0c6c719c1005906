"""FedDTRE's server side (METHODS.md section 2) as a Flower Message-API strategy.

Each round it samples clients (as FedAvg) and sends the global adapter with the round's mixing
schedule: k grows with training (k_t = k0 + k_growth (t - 1), t the round), midpoint, alpha_min
and alpha_max; or, for the fixed-alpha baselines, only ``fixed_alpha``. Each client trains to
W_local, picks its alpha (``fedsim.trust_mixing``) and returns W = (1 - alpha) W_local +
alpha W_global with its alpha (and its trust scores). The server takes the plain mean of the
returned weights (the paper's aggregation; not weighted by data size) and records every client's
alpha per round.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedsim.runtime.messaging import phase_grid
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.validators import Metrics, Number, both, like_model
from fedsim.trust_mixing import ALPHA, MIXING, RECORDED, S_GLOBAL, S_LOCAL


def k_at(server_round: int, k0: float, k_growth: float) -> float:
    """The sigmoid's steepness in round ``server_round`` (1-based): k0, growing linearly."""
    if server_round < 1:
        raise ValueError(f"rounds start at 1, got {server_round}")
    return k0 + k_growth * (server_round - 1)


def plain_mean(weights: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The unweighted mean of the clients' weights, key by key (float64 sums)."""
    if not weights:
        raise ValueError("no weights to average")
    return {
        key: np.mean([np.asarray(w[key], dtype=np.float64) for w in weights], axis=0).astype(
            value.dtype
        )
        for key, value in weights[0].items()
    }


MIXING_METRICS = Metrics(
    optional={ALPHA: Number(0.0, 1.0), **{k: Number() for k in RECORDED if k != ALPHA}}
)


def _mixing(content: RecordDict, node: int) -> str | None:
    records = list(content.metric_records.values())
    return (
        "expected one MetricRecord"
        if len(records) != 1
        else MIXING_METRICS.problem(records[0], node)
    )


class TrustAlpha(FedAvg):
    """FedAvg's sampling with FedDTRE's schedule in every train message and a plain mean.

    ``alphas`` holds, per round, every replying client's alpha (and s_l, s_g, the standard error
    of their difference under trust mixing; its local model's train and held-out nll where the
    client measured them).
    """

    def __init__(
        self,
        k0: float = 0.7,
        k_growth: float = 0.1,
        midpoint: float = 0.01,
        alpha_min: float = 0.1,
        alpha_max: float = 1.0,
        fixed_alpha: float | None = None,
        **fedavg,
    ):
        super().__init__(**fedavg)
        if not 0.0 <= alpha_min <= alpha_max <= 1.0:
            raise ValueError(f"need 0 <= alpha_min <= alpha_max <= 1, got {alpha_min}, {alpha_max}")
        if fixed_alpha is not None and not 0.0 <= fixed_alpha <= 1.0:
            raise ValueError(f"fixed_alpha must lie in [0, 1], got {fixed_alpha}")
        if k0 <= 0 or k_growth < 0:
            raise ValueError(f"need k0 > 0 and k_growth >= 0, got {k0}, {k_growth}")
        self.k0, self.k_growth, self.midpoint = k0, k_growth, midpoint
        self.alpha_min, self.alpha_max, self.fixed_alpha = alpha_min, alpha_max, fixed_alpha
        self.alphas: dict[int, list[dict]] = {}

    @property
    def scores_trust(self) -> bool:
        """Whether clients need the trust evaluator (not for a fixed alpha)."""
        return self.fixed_alpha is None

    def mixing(self, server_round: int) -> dict:
        if self.fixed_alpha is not None:
            return {"fixed_alpha": self.fixed_alpha}
        return {
            "k": k_at(server_round, self.k0, self.k_growth),
            "midpoint": self.midpoint,
            "alpha_min": self.alpha_min,
            "alpha_max": self.alpha_max,
        }

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args, **kwargs):
        """Flower's round loop, every train reply checked against the model's keys, shapes and
        dtypes (``plain_mean`` cannot average arrays of different shapes) and its alpha and trust
        scores numbers (alpha in [0, 1]): a client's wrong reply is counted ``malformed`` and left
        out instead of stopping the run."""
        view = phase_grid(grid, "trust-alpha").checked(
            MessageType.TRAIN, both(like_model(initial_arrays), _mixing)
        )
        return super().start(view, initial_arrays, *args, **kwargs)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        config = ConfigRecord(
            {**dict(config.items()), MIXING: json.dumps(self.mixing(server_round))}
        )
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid, _ = self._check_and_log_replies(replies, is_train=True)
        if not valid:
            return None, None
        rows = []
        for msg in valid:
            metrics = next(iter(msg.content.metric_records.values()))
            rows.append(
                {
                    "node": msg.metadata.src_node_id,
                    **{k: float(metrics[k]) for k in RECORDED if k in metrics},
                }
            )
        self.alphas[server_round] = rows
        arrays = to_record(
            plain_mean([from_record(m.content[self.arrayrecord_key]) for m in valid])
        )
        summary = {
            f"{k}-mean": float(np.mean([r[k] for r in rows]))
            for k in (ALPHA, S_LOCAL, S_GLOBAL)
            if all(k in r for r in rows)
        }
        return arrays, MetricRecord(summary)
