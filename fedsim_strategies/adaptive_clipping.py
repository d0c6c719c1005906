"""Flower's adaptive-clipping DP wrappers, in the order of Andrew et al. 2021 (Algorithm 1).

The paper ("Differentially private learning with adaptive clipping") clips round t's updates to
C_t, adds N(0, (z C_t)^2) to their sum, and then moves the norm toward the gamma-quantile of the
update norms: C_{t+1} = C_t exp(-eta (b - gamma)), b the noisy share of updates that were NOT
clipped. Flower 1.42 (``flwr/serverapp/strategy/dp_adaptive_clipping.py``) departs twice:

- it updates C before it noises the mean, so round t's noise is z C_{t+1} / m on a mean whose
  sensitivity is C_t / m: the multiplier applied is z C_{t+1} / C_t (from z e^-0.1 to z e^0.1 at
  the default step), not the z the run accounts;
- its bit is 1 for a *clipped* update (``adaptive_clip_inputs_inplace`` returns
  ``scaling_factor < 1``; Flower's legacy client sent ``not clipped``), so C moved away from
  the quantile: it shrank while every update was clipped.

These subclasses keep Flower's clipping, its noisy count (std ``clipped_count_stddev``) and its
noise, and fix both: the round's noise uses the C its updates were clipped to, and C then moves
by the noisy unclipped share toward ``target_unclipped_quantile`` (the paper's gamma).
``tests/test_central_dp.py`` measures the noise added against the noise reported.
"""

from __future__ import annotations

import math

from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    Strategy,
)


class PaperOrder:
    """The two fixes, over either of Flower's adaptive wrappers (server- or client-side clipping)."""

    def __init__(
        self,
        strategy: Strategy,
        noise_multiplier: float,
        num_sampled_clients: int,
        initial_clipping_norm: float = 0.1,
        target_unclipped_quantile: float = 0.5,
        clip_norm_lr: float = 0.2,
        clipped_count_stddev: float | None = None,
    ):
        super().__init__(
            strategy,
            noise_multiplier,
            num_sampled_clients,
            initial_clipping_norm,
            target_unclipped_quantile,
            clip_norm_lr,
            clipped_count_stddev,
        )
        self.target_unclipped_quantile = target_unclipped_quantile
        self.next_clipping_norm: float | None = None

    def _geometric_update(self, clipped_fraction: float) -> None:
        """Flower calls this with the noisy clipped share before it noises the mean: the new C
        waits until the round's noise is added."""
        unclipped = 1.0 - clipped_fraction
        self.next_clipping_norm = self.clipping_norm * math.exp(
            -self.clip_norm_lr * (unclipped - self.target_unclipped_quantile)
        )

    def aggregate_train(self, server_round, replies):
        self.next_clipping_norm = None
        aggregated = super().aggregate_train(server_round, replies)
        if self.next_clipping_norm is not None:
            self.clipping_norm = self.next_clipping_norm
        return aggregated


class ServerSideAdaptiveClipping(PaperOrder, DifferentialPrivacyServerSideAdaptiveClipping):
    """Flower's server-side adaptive clipping, noised and updated as Andrew et al. do."""


class ClientSideAdaptiveClipping(PaperOrder, DifferentialPrivacyClientSideAdaptiveClipping):
    """Flower's client-side adaptive clipping (clients clip with ``adaptiveclipping_mod``, whose
    bit is 1 for a clipped update too), noised and updated as Andrew et al. do."""
