"""Client-level DP mean of client vectors (FedTP's global prior), as a Flower Message-API Strategy.

The server trusts no client: it clips every received row to norm C itself, adds
N(0, sigma^2 C^2 I) to the sum, divides by the number of contributing rows and, when asked,
clamps the mean back onto the simplex. One round is FedTP's one-shot release; more rounds
re-sample clients and release again, and the RDP accountant composes them.

Each reply carries an ArrayRecord with ``array_key``: a (rows, dim) matrix, one row per client
the node hosts (normally one). Validation of malformed replies is ReplyGuard's job.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedsim.privacy import Release, gaussian_mean, one_shot_epsilon, rdp_epsilon

log = logging.getLogger("fedsim")


class DPMean(Strategy):
    def __init__(
        self,
        clip_norm: float = 1.0,
        noise_multiplier: float = 1.0,
        delta: float = 1e-5,
        fraction_train: float = 1.0,
        min_train_nodes: int = 1,
        simplex: bool = True,
        seed: int = 0,
        array_key: str = "vectors",
    ):
        if clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        if noise_multiplier < 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if not 0 < fraction_train <= 1:
            raise ValueError(f"fraction_train must be in (0, 1], got {fraction_train}")
        self.clip_norm = clip_norm
        self.noise_multiplier = noise_multiplier
        self.delta = delta
        self.fraction_train = fraction_train
        self.min_train_nodes = min_train_nodes
        self.simplex = simplex
        self.seed = seed
        self.array_key = array_key
        self.received: np.ndarray | None = None  # last round's validated rows (central-DP server)
        self._sampling: list[tuple[int, int]] = []  # (sample size, population) per round

    def summary(self) -> None:
        log.info("DPMean: C=%g sigma=%g delta=%g fraction=%g simplex=%s seed=%d",
                 self.clip_norm, self.noise_multiplier, self.delta, self.fraction_train,
                 self.simplex, self.seed)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        nodes = list(grid.get_node_ids())  # the grid's order (partition order), not node ids: random per run
        if not nodes:
            raise RuntimeError("DPMean: no client nodes are connected")
        size = min(len(nodes), max(self.min_train_nodes, int(len(nodes) * self.fraction_train)))
        sampled = random.Random(f"{self.seed}/{server_round}").sample(nodes, size)
        self._sampling.append((size, len(nodes)))
        # one shared RecordDict, as FedAvg does: Flower stores identical content once
        content = RecordDict({"arrays": arrays,
                              "config": ConfigRecord({**config, "server-round": server_round})})
        log.info("DPMean round %d: %d of %d nodes sampled", server_round, size, len(nodes))
        return [Message(content, dst_node_id=node, message_type=MessageType.TRAIN)
                for node in sampled]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        rows = [msg.content.array_records[next(iter(msg.content.array_records))][self.array_key]
                .numpy() for msg in replies if not msg.has_error()]
        if not rows:
            log.warning("DPMean round %d: no usable client vectors, nothing released", server_round)
            return None, None
        self.received = np.concatenate(rows, axis=0)
        release = self.release(self.received, self.noise_multiplier, self.seed + server_round)
        metrics = MetricRecord({
            "clients": release.num_clients,
            "noise-std": release.noise_std,
            "epsilon-one-shot": _finite(one_shot_epsilon(self.noise_multiplier, self.delta)),
            "epsilon-rdp": _finite(self.epsilon_rdp()),
        })
        return ArrayRecord({self.array_key: Array(release.mean)}), metrics

    def release(self, vectors: np.ndarray, noise_multiplier: float, seed: int) -> Release:
        """One Gaussian-mechanism release of the mean of ``vectors`` (noise seeded by ``seed``)."""
        return gaussian_mean(vectors, self.clip_norm, noise_multiplier,
                             np.random.default_rng(seed), self.simplex)

    def epsilon_rdp(self, noise_multiplier: float | None = None) -> float:
        """Cumulative epsilon of the rounds run so far (RDP accountant), at this strategy's
        sigma or at ``noise_multiplier`` (what the same rounds would cost under another sigma)."""
        if not self._sampling:
            return 0.0
        sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        size, population = self._sampling[-1]
        return rdp_epsilon(sigma, self.delta, len(self._sampling), size, population)

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        return []  # the task's protocol evaluates the release

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        return None


def _finite(value: float) -> float:
    """MetricRecord and JSON cannot hold inf: -1 marks 'no privacy' (sigma = 0)."""
    return value if np.isfinite(value) else -1.0
