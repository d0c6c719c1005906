"""DPMean as distributed DP under SecAgg+ (``privacy=secagg_ddp``): each client clips its rows,
turns them into integers and adds its share of Skellam noise before it masks them
(``fedsim/privacy/secagg/ddp.py``), so the server unmasks only the noised sum, and no party, the
server or a colluding set below SecAgg+'s threshold t, sees a row or the sum without the honest
clients' noise. The same SecAgg+ round as ``privacy=secagg`` (``fedsim_strategies/secagg.py``);
what differs is what a client encodes (the mask stage's config: :meth:`DDPRound.mask_config`)
and what the server makes of the sum (:meth:`DDPRound._aggregate_reply`,
:meth:`DistributedDPMean.aggregate_train`: the DP mean, as DPMean releases it).

Dropouts: the round's noise is sized for ``min_live`` = ceil((1 - dropout_tolerance) x the
clients that shared) survivors; a round with fewer live inputs is refused by every client
(``protocol.check``) and fails here with the reason. The epsilon reported is that of the noise
present in the sum (the live clients' shares, less ``colluders`` of them), by Skellam's RDP
bound (``ddp.skellam_epsilon``), for replace-one neighbours as DPMean's.
"""

from __future__ import annotations

import logging
import math

from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from fedsim.message_keys import ARRAYS
from fedsim.privacy.dp import Epsilon, Release, clamp_to_simplex
from fedsim.privacy.secagg import ddp, protocol
from fedsim.privacy.secagg import messages as keys
from fedsim_strategies.dp_mean import DPMean
from fedsim_strategies.secagg import RoundRun, SecAggPlus

log = logging.getLogger("fedsim")

VARIANCE = "ddp-variance"  # a round's figure: the sum's noise variance per coordinate (integers)


class DistributedDPMean(SecAggPlus):
    """``strategy`` (a DPMean: its clip_norm, noise_multiplier, delta, simplex, array_key) released
    from SecAgg+'s sum of the clients' noised integer rows.

    ``dropout_tolerance``: the share of the clients that shared keys which may drop before the
    sum (the noise is sized for the rest); ``colluders``: clients assumed to add no noise (or to
    collude with the server); ``scale_bits``: B = 2^scale_bits, a clipped row's integer norm;
    ``max_rows``: rows one node may send; ``degree``, ``threshold``: SecAgg+'s."""

    privacy_kind = "secagg_ddp"  # fedsim/config/schema.py's wrapper_kind: privacy.kind=secagg_ddp

    def __init__(
        self,
        strategy: DPMean,
        degree: int | None = None,
        threshold: float = 0.5,
        dropout_tolerance: float = 0.1,
        colluders: int = 0,
        scale_bits: int = 16,
        max_rows: int = 1,
    ):
        if not isinstance(strategy, DPMean):
            raise ValueError(
                f"privacy=secagg_ddp releases DPMean's mean (strategy=dp_mean), not "
                f"{type(strategy).__name__}"
            )
        if strategy.noise_multiplier <= 0:
            raise ValueError(
                "privacy=secagg_ddp needs strategy.noise_multiplier > 0 (no noise: no DP)"
            )
        if strategy.fraction_train < 1:
            raise ValueError(
                "privacy=secagg_ddp with client sampling (strategy.fraction_train < 1) is not "
                "built: DPMean's sampled rounds divide by the expected count, which the clients' "
                "noise shares do not know"
            )
        if strategy.audit_canaries:
            raise ValueError(
                "privacy.audit in the run needs the exact clipped sum, which only the clients "
                "hold under secagg_ddp: audit the mechanism with bench/privacy_audit.py --ddp"
            )
        if not 0 <= dropout_tolerance < 1:
            raise ValueError(f"dropout_tolerance must be in [0, 1), got {dropout_tolerance}")
        if colluders < 0 or not 1 <= scale_bits <= 24 or max_rows < 1:
            raise ValueError("colluders >= 0, scale_bits in [1, 24] and max_rows >= 1 needed")
        super().__init__(strategy, degree, threshold, clip_range=1.0, max_weight=float(max_rows))
        self.tolerance, self.colluders = float(dropout_tolerance), int(colluders)
        self.bound, self.max_rows = 2**scale_bits, int(max_rows)
        self.variances: list[float] = []  # each release's noise variance in the sum (integers)
        self.received = None  # the server never holds the rows (FedTP's sweep needs them)
        self.canaries = None
        self.last_release: Release | None = None
        self.dim: int | None = None

    noise_multiplier = property(lambda self: self.strategy.noise_multiplier)
    delta = property(lambda self: self.strategy.delta)
    clip_norm = property(lambda self: self.strategy.clip_norm)
    simplex = property(lambda self: self.strategy.simplex)
    max_rows_per_reply = property(lambda self: self.max_rows)

    def summary(self) -> None:
        log.info(
            "distributed DP (Skellam, B=2^%d, dropout tolerance %g, colluders %d) under:",
            round(math.log2(self.bound)),
            self.tolerance,
            self.colluders,
        )
        super().summary()

    def noise_plan(self, clients: int) -> ddp.NoisePlan:
        """The round's noise for ``clients`` that shared keys (refused where it cannot hold)."""
        min_live = max(1, math.ceil((1 - self.tolerance) * clients - 1e-9))
        try:
            plan = ddp.NoisePlan(self.noise_multiplier, self.bound, min_live, self.colluders)
            plan.check_range(clients * self.max_rows)
        except ValueError as exc:
            raise protocol.Unrecoverable(f"distributed DP for {clients} clients: {exc}") from exc
        return plan

    def aggregate_train(self, server_round: int, replies):
        """The release from the round's one reply (the unmasked noised sum): divided by the
        rows, on the simplex when DPMean's is, its epsilon composed over the rounds."""
        replies = [m for m in replies if not m.has_error()]
        if not replies:
            return None, None
        content = replies[0].content
        noised_sum = content[ARRAYS][self.strategy.array_key].numpy()
        rows = int(content[keys.METRICS][self.weight_key])
        figures = self.rounds[server_round]
        self.variances.append(figures[VARIANCE])
        self.dim = noised_sum.size
        noised = noised_sum / rows
        std = math.sqrt(figures[VARIANCE]) / self.bound  # in units of C: the effective sigma
        mean = clamp_to_simplex(noised) if self.simplex else noised
        self.last_release = Release(mean, rows, std * self.clip_norm, noised)
        spent = self.epsilon()
        metrics = {
            "clients": rows,
            "noise-std": std * self.clip_norm,
            "noise-multiplier-present": std,
            "epsilon": spent.reported,
            "epsilon-rdp": spent.rdp,
            "epsilon-pld": -1.0,  # none: Skellam's loss is not one-dimensional (ddp.py)
            "epsilon-guaranteed": self.epsilon(self.noise_multiplier).reported,
            **{k: v for k, v in figures.items() if k != VARIANCE},
        }
        return ArrayRecord({self.strategy.array_key: Array(mean)}), MetricRecord(metrics)

    def epsilon(self, noise_multiplier: float | None = None) -> Epsilon:
        """Epsilon of the releases so far: of the noise present in each sum, or, at
        ``noise_multiplier``, of that sigma (the guarantee stated before the rounds: at least
        ``min_live`` honest survivors)."""
        variances = (
            self.variances
            if noise_multiplier is None
            else [(noise_multiplier * self.bound) ** 2] * len(self.variances)
        )
        l2, l1 = ddp.sensitivities(self.bound, self.dim or 1, self.simplex)
        return ddp.skellam_epsilon(variances, l2, l1, self.delta)


class DDPRound(RoundRun):
    """A SecAgg+ round whose clients encode noised integer rows (``ddp.encode_rows``)."""

    def mask_config(self) -> dict:
        s = self.s
        self.plan = s.noise_plan(len(self.shared))
        return {
            keys.DDP_NOISE: self.plan.noise_multiplier,
            keys.DDP_BOUND: self.plan.bound,
            keys.DDP_MIN_LIVE: self.plan.min_live,
            keys.DDP_COLLUDERS: self.plan.colluders,
            keys.DDP_CLIP: float(s.clip_norm),
            keys.DDP_SIMPLEX: bool(s.simplex),
            keys.DDP_ARRAY: s.strategy.array_key,
            keys.WEIGHT_KEY: s.weight_key,
        }

    def _live(self, masked_with):
        live, dropped = super()._live(masked_with)
        if len(live) < self.plan.min_live:
            raise protocol.Unrecoverable(
                f"{len(live)} live inputs, fewer than the {self.plan.min_live} the clients' "
                f"noise is sized for (dropout_tolerance {self.s.tolerance}): the clients "
                "refuse to sign a smaller live set"
            )
        return live, dropped

    def _aggregate_reply(self, total, replies, dropped):
        """The strategy's one reply: the noised sum of the rows (in the rows' units), the row
        count, the round's figures."""
        rows, values = ddp.decode_sum(total)
        reported = sum(int(m.content[keys.METRICS][self.s.weight_key]) for m in replies)
        if rows != reported:
            raise protocol.Unrecoverable(
                f"the masked row counts sum to {rows}, the replies reported {reported}: a live "
                "client masked another count than it reported"
            )
        figures = {
            "secagg-live": len(replies),
            "secagg-dropped": dropped,
            "ddp-min-live": self.plan.min_live,
            VARIANCE: self.plan.present_variance(len(replies)),
        }
        self.s.rounds[self.rnd] = dict(figures)
        out = replies[0]
        out.content = RecordDict(
            {
                ARRAYS: ArrayRecord(
                    {self.s.strategy.array_key: Array(values * (self.s.clip_norm / self.s.bound))}
                ),
                keys.METRICS: MetricRecord({self.s.weight_key: rows}),
            }
        )
        return out


DistributedDPMean.round_class = DDPRound
