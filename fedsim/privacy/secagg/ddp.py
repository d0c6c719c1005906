"""Distributed DP under SecAgg+: each client noises its own rows in the integer domain before it
masks them, so the sum the server unmasks carries the stated noise and no party sees a row, or
the sum, without it (``privacy=secagg_ddp``, ``fedsim_strategies/secagg_ddp.py``).

**The noise: Skellam** (Agarwal, Kairouz & Liu, "The Skellam Mechanism for Differentially
Private Federated Learning", NeurIPS 2021): Sk(mu) = Poisson(mu / 2) - Poisson(mu / 2), variance
mu per coordinate. A sum of independent Skellams is a Skellam with the summed variance, so n
clients that each add variance mu / m give a sum whose noise is exactly Sk(n mu / m): the
server's view is one Skellam mechanism, whatever the number of survivors, and the accountant
needs no approximation term. The distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML
2021) is not closed under summation: its sum is only close to a discrete Gaussian, and its bound
adds a term that grows with the clients; it also needs an exact discrete-Gaussian sampler, which
neither numpy nor dp-accounting ships, while numpy's Poisson sampler is all Skellam needs.

**Quantization.** A client clips each row to L2 norm C (non-negative entries first on the
simplex), scales it by B / C (B = 2^scale_bits: a clipped row's integer norm bound), rounds
each value stochastically to an integer and, in the rare case the rounding pushed the norm past
B, truncates the row toward zero until it fits (:func:`integer_row`): every integer row has
norm at most B, so replacing one row moves the integer sum by at most sqrt 2 B (non-negative
rows) or 2 B in L2, and by at most that squared in L1 (an integer vector's L1 norm is at most its
squared L2 norm). The node then sums its rows, adds its noise share and sends the sum mod 2^32
under SecAgg+'s masks (:func:`encode_rows`), its row count in the first slot.

**Dropouts.** A round states the least live count it may sum, ``min_live`` (the sampled count
less the dropout tolerance); each client adds variance (sigma B)^2 / (min_live - colluders) and
refuses, at SecAgg+'s consistency check, to sign a live set smaller than ``min_live``
(``protocol.check``): a sum of fewer inputs is never unmasked, and a sum of ``live`` inputs of
which ``colluders`` skipped their noise still carries (live - colluders) / (min_live - colluders)
>= 1 times the stated variance. The accountant reports the epsilon of the noise actually present
(:func:`skellam_epsilon`).

**Accounting.** Theorem 3.5 of Agarwal et al. (the bound their Corollary 3.6 and TF-Privacy's
``DistributedSkellamSumQuery`` use): for integer alpha > 1,
eps(alpha) <= alpha D2^2 / (2 mu) + min(((2 alpha - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu)),
mu the sum's per-coordinate variance, D1 and D2 the sensitivities in L1 and L2. Hand-written:
dp-accounting 0.6 and Opacus 1.6 have no Skellam event; dp-accounting converts the curve to
(epsilon, delta) (``rdp.compute_epsilon``), as for fedsim's other RDP bounds. No PLD: the
multi-dimensional Skellam's privacy loss is not a one-dimensional one, so the reported epsilon
is RDP's (central DP's reported one is the smaller of RDP and PLD: ``fedsim/privacy/dp.py``).
The bound is checked against the exact Renyi divergence of two shifted Skellams in
``test_ddp.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dp_accounting import rdp

from fedsim.privacy.dp import Epsilon

RING = 2**32
HALF = 2**31

ORDERS = np.array(list(range(2, 64)) + list(range(64, 257, 8)) + [384, 512, 768, 1024], float)
"""integer Renyi orders: Theorem 3.5 holds at integer alpha > 1"""


@dataclass(frozen=True)
class NoisePlan:
    """One round's distributed noise, as the server states it to every client (mask stage).

    ``noise_multiplier``: sigma, the sum's noise std in units of C with ``min_live`` honest
    survivors; ``bound``: B, a row's integer L2 norm bound (C in integer units); ``min_live``:
    the least live count the clients sign; ``colluders``: clients assumed to skip their noise
    (or to collude with the server and subtract their own)."""

    noise_multiplier: float
    bound: int
    min_live: int
    colluders: int = 0

    def __post_init__(self):
        if self.noise_multiplier <= 0:
            raise ValueError(
                f"distributed DP needs noise_multiplier > 0, got {self.noise_multiplier}"
            )
        if self.bound < 1:
            raise ValueError(f"bound must be >= 1, got {self.bound}")
        if not 0 <= self.colluders < self.min_live:
            raise ValueError(
                f"colluders={self.colluders} must be in [0, min_live={self.min_live}): the noise "
                "is sized for min_live - colluders honest survivors"
            )

    @property
    def share_variance(self) -> float:
        """Each client's Skellam variance per coordinate, in integer units."""
        return (self.noise_multiplier * self.bound) ** 2 / (self.min_live - self.colluders)

    def present_variance(self, live: int) -> float:
        """The sum's variance per coordinate when ``live`` inputs are summed, ``colluders`` of
        them without noise: at least (sigma B)^2 when ``live >= min_live``."""
        return max(live - self.colluders, 0) * self.share_variance

    def check_range(self, clients: int) -> None:
        """Refuse a round whose sum could wrap around 2^32: ``clients`` rows of norm B each, and
        the noise's 12 standard deviations (a chance below 1e-30 per coordinate)."""
        top = clients * self.bound + 12 * math.sqrt(clients * self.share_variance)
        if top >= HALF:
            raise ValueError(
                f"{clients} rows at integer bound {self.bound} with noise std "
                f"{math.sqrt(clients * self.share_variance):.3g} can reach {top:.3g} >= 2^31: "
                "lower scale_bits"
            )


def skellam(variance: float, size: int, rng: np.random.Generator) -> np.ndarray:
    """Sk(variance) per coordinate: the difference of two Poisson(variance / 2)."""
    if variance <= 0:
        return np.zeros(size, np.int64)
    return rng.poisson(variance / 2, size).astype(np.int64) - rng.poisson(variance / 2, size)


def integer_row(
    row: np.ndarray, clip_norm: float, bound: int, simplex: bool, rng: np.random.Generator
) -> np.ndarray:
    """``row`` (non-negative first on the ``simplex``) clipped to norm C, scaled to B / C,
    stochastically rounded, then truncated toward zero where its norm exceeds B."""
    values = np.maximum(row, 0.0) if simplex else np.asarray(row, np.float64)
    norm = float(np.linalg.norm(values))
    scaled = values * (bound / max(norm, clip_norm))
    low = np.floor(scaled)
    out = (low + (rng.random(scaled.shape) < scaled - low)).astype(np.int64)
    size = float(np.linalg.norm(out))
    if size > bound:
        out = (np.sign(out) * np.floor(np.abs(out) * (bound / size))).astype(np.int64)
    return out


def encode_rows(
    rows: np.ndarray,
    clip_norm: float,
    simplex: bool,
    plan: NoisePlan,
    rng: np.random.Generator,
) -> np.ndarray:
    """A node's input: its row count, then its integer rows' sum plus one Skellam share, mod 2^32
    (uint32, the ring SecAgg+ masks in)."""
    rows = np.atleast_2d(np.asarray(rows, np.float64))
    total = sum(integer_row(r, clip_norm, plan.bound, simplex, rng) for r in rows)
    noised = total + skellam(plan.share_variance, rows.shape[1], rng)
    return np.concatenate([[len(rows)], noised]).astype(np.int64).astype(np.uint32)


def decode_sum(total: np.ndarray) -> tuple[int, np.ndarray]:
    """An unmasked sum of :func:`encode_rows` inputs: (rows, the noised integer sum), the sum's
    values read as signed (centred on 0 mod 2^32)."""
    signed = total.astype(np.int64)
    signed = np.where(signed >= HALF, signed - RING, signed)
    return int(signed[0]), signed[1:]


def sensitivities(bound: int, dim: int, simplex: bool) -> tuple[float, float]:
    """(L2, L1) of the integer sum when one row is replaced: sqrt 2 B for non-negative rows
    (|y - y'|^2 <= |y|^2 + |y'|^2), else 2 B; L1 at most sqrt(dim) L2 and at most L2^2."""
    l2 = (math.sqrt(2.0) if simplex else 2.0) * bound
    return l2, min(math.sqrt(dim) * l2, l2 * l2)


def skellam_rdp(variance: float, l2: float, l1: float, orders=ORDERS) -> np.ndarray:
    """Theorem 3.5's RDP curve of one Skellam release of per-coordinate ``variance``."""
    a = np.asarray(orders, float)
    return a * l2**2 / (2 * variance) + np.minimum(
        ((2 * a - 1) * l2**2 + 6 * l1) / (4 * variance**2), 3 * l1 / (2 * variance)
    )


def skellam_epsilon(variances: list[float], l2: float, l1: float, delta: float) -> Epsilon:
    """Epsilon at ``delta`` of the Skellam releases of ``variances`` (one per round, composed),
    replace-one neighbours folded into the sensitivities. RDP only (no PLD: the module's
    docstring): ``pld`` is inf, so ``reported`` is RDP's."""
    if not variances:
        return Epsilon(0.0, 0.0)
    if min(variances) <= 0:
        return Epsilon(math.inf, math.inf)
    curve = sum(skellam_rdp(v, l2, l1) for v in variances)
    return Epsilon(float(rdp.compute_epsilon(ORDERS, curve, delta)[0]), math.inf)
