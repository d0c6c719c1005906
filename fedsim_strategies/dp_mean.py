"""Client-level DP mean of client vectors (FedTP's global prior), as a Flower Message-API Strategy.

The server trusts no client: it clips every received row to norm C itself (on the simplex,
negative entries to 0 first), adds N(0, sigma^2 C^2 I) to the sum, divides by the number of
contributing rows and, when asked, clamps the mean back onto the simplex. One round is FedTP's
one-shot release; more rounds re-sample clients and release again.

Accounting (:func:`fedsim.privacy.dp.release_epsilon`): each round is one Gaussian release for
replace-one neighbours, with no amplification by sampling, because results.json publishes every
round's realized count ("clients", the fault counts); its epsilon is reported by RDP and by PLD.
Non-negative rows (``simplex``) differ by at most sqrt 2 C, other rows by 2 C.

Noise and sampling come from a :class:`~fedsim.privacy.dp.NoiseSource`, private unless the run
asked for reproducible noise: with noise drawn from the public seed anyone could subtract it.
A sampled round (fraction_train < 1) is Poisson sampling at rate k / N from the run's secret,
the release divided by the expected count k.

Each reply carries an ArrayRecord with ``array_key``: a (rows, dim) matrix, one row per client
the node hosts (normally one). Malformed replies never reach it: the phase's validator
(``fedsim.runtime.validators``; FedTP's ``fedsim_clients/fedtp_messages.train_reply``: at most the rows its
node hosts) screens every reply in
:meth:`fedsim.runtime.messaging.Messenger.exchange`, which leaves them out and counts them as ``malformed``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

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

from fedsim.message_keys import ARRAYS, CONFIG, SERVER_ROUND
from fedsim.privacy.audit import MeanCanaries
from fedsim.privacy.dp import (
    AUDIT,
    NON_NEGATIVE,
    RELEASE,
    REPLACE_ONE,
    SAMPLE,
    Epsilon,
    NoiseSource,
    Release,
    clip_rows,
    gaussian_mean,
    poisson_sample,
    release_epsilon,
)
from fedsim.runtime.validators import npy_view

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
        array_key: str = "vectors",
        noise: NoiseSource | None = None,
        audit_canaries: int = 0,
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
        self.array_key = array_key
        self.noise = (
            noise or NoiseSource.fresh()
        )  # the run's (fedsim/privacy/plan.py), given at construction
        self.received: np.ndarray | None = None  # last round's validated rows (central-DP server)
        self.denominator: float | None = None  # last round's divisor (None: the row count)
        self.rounds = 0  # releases so far
        self._sample = (0, 0)  # the last round's (expected sample size, population)
        self._dim: int | None = None  # length of the released vector (a noise-only release)
        self.audit_canaries = (
            audit_canaries  # canary clients an audit run adds (fedsim/privacy/audit.py); 0: none
        )
        self.canaries: MeanCanaries | None = None  # the last round's, with their coins
        self.last_release: Release | None = None  # the last round's (an audit checks its noise)

    @property
    def max_rows_per_reply(self) -> int | None:
        """Rows one reply may carry. Sampled rounds sample replies: one row per reply, so that a
        row's coin alone decides whether it is in a round. Unsampled: any (each row is clipped)."""
        return 1 if self.fraction_train < 1 else None

    def summary(self) -> None:
        log.info(
            "DPMean: C=%g sigma=%g delta=%g fraction=%g simplex=%s private noise=%s",
            self.clip_norm,
            self.noise_multiplier,
            self.delta,
            self.fraction_train,
            self.simplex,
            self.noise.private,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        nodes = list(
            grid.get_node_ids()
        )  # the grid's order (partition order), not node ids: random per run
        if not nodes:
            raise RuntimeError("DPMean: no client nodes are connected")
        size = min(len(nodes), max(self.min_train_nodes, int(len(nodes) * self.fraction_train)))
        sampled = (
            nodes
            if size == len(nodes)
            else poisson_sample(nodes, size / len(nodes), self.noise.rng(SAMPLE, server_round))
        )
        self.rounds += 1
        self._sample = (size, len(nodes))
        if self.array_key in arrays:
            self._dim = arrays[self.array_key].numpy().size
        # one shared RecordDict, as FedAvg does: Flower stores identical content once
        content = RecordDict(
            {ARRAYS: arrays, CONFIG: ConfigRecord({**config, SERVER_ROUND: server_round})}
        )
        log.info(
            "DPMean round %d: %d of %d nodes sampled (expected %d)",
            server_round,
            len(sampled),
            len(nodes),
            size,
        )
        return [
            Message(content, dst_node_id=node, message_type=MessageType.TRAIN) for node in sampled
        ]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        rows = [  # each reply's one ArrayRecord (the Messenger checked it), read in place
            npy_view(
                next(r for r in msg.content.values() if isinstance(r, ArrayRecord))[self.array_key]
            )
            for msg in replies
            if not msg.has_error()
        ]
        size, population = self._sample
        self.denominator = float(size) if size < population else None
        if not rows and (self.denominator is None or self._dim is None):
            log.warning("DPMean round %d: no usable client vectors, nothing released", server_round)
            return None, None
        self.received = np.concatenate(rows, axis=0) if rows else np.zeros((0, self._dim))
        if (
            self.audit_canaries
        ):  # canary clients beside the received ones, coins from the run's secret
            self.canaries = MeanCanaries.place(
                clip_rows(self.received, self.clip_norm).sum(axis=0),
                self.audit_canaries,
                self.clip_norm,
                self.noise.rng(AUDIT, server_round),
            )
            self.received = np.vstack([self.received, self.canaries.rows()])
        self.last_release = self.release(
            self.received, self.noise_multiplier, (RELEASE, server_round)
        )
        spent = self.epsilon()
        metrics = MetricRecord(
            {
                "clients": self.last_release.num_clients,
                "noise-std": self.last_release.noise_std,
                "epsilon": _finite(spent.reported),
                "epsilon-rdp": _finite(spent.rdp),
                "epsilon-pld": _finite(spent.pld),
            }
        )
        return ArrayRecord({self.array_key: Array(self.last_release.mean)}), metrics

    def release(
        self, vectors: np.ndarray, noise_multiplier: float, labels: tuple[int, ...]
    ) -> Release:
        """One Gaussian-mechanism release of the mean of ``vectors`` with noise from the stream
        ``labels`` of :attr:`noise` (one no other release uses), divided as the last round was."""
        release = gaussian_mean(
            vectors,
            self.clip_norm,
            noise_multiplier,
            self.noise.rng(*labels),
            self.simplex,
            self.denominator,
        )
        return replace(release, labels=labels)

    @property
    def sensitivity(self) -> float:
        """How far replacing one row moves the clipped sum, in C: rows put on the simplex are
        non-negative (sqrt 2), others not (2)."""
        return NON_NEGATIVE if self.simplex else REPLACE_ONE

    def epsilon(self, noise_multiplier: float | None = None) -> Epsilon:
        """Epsilon of the rounds released so far, at this strategy's sigma or at
        ``noise_multiplier`` (what the same rounds would cost under another sigma)."""
        sigma = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        return release_epsilon(sigma, self.delta, self.rounds, self.sensitivity)

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable[Message]:
        return []  # the task's protocol evaluates the release

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        return None


def _finite(value: float) -> float:
    """MetricRecord and JSON cannot hold inf: -1 marks 'no privacy' (sigma = 0)."""
    return value if np.isfinite(value) else -1.0
