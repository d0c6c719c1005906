"""Client-level Gaussian mechanism for a mean of vectors, and its epsilon.

Clipping, noising and the simplex step are a few lines of numpy: Flower's DP wrappers clip and
noise whole FedAvg model updates and cannot release a mean of arbitrary vectors with a custom
post-processing step, so this module does only that, and leaves accounting to Google's
dp-accounting (the library Flower's own ``RdpAccountant`` wraps, installed with ``flwr[dp]``).

:func:`release_epsilon` is fedsim's only account of a central-DP release, for ``dp_mean`` and for
Flower's DP wrappers (:class:`CentralDP`): replace-one neighbours, no amplification by sampling
(why: its docstring), each epsilon by RDP and by the privacy loss distribution side by side
(:func:`account`). Flower's ``RdpAccountant`` is not used: it has no PLD accountant, and its
add-or-remove relation with the sample size as the event is what fedsim's published counts
break. fedsim does not use the wrappers' ``accountant=`` mode either: it takes fixed clipping
around a plain ``FedAvg.aggregate_train`` only, and refuses a round with fewer replies than
sampled, which fedsim noises at sigma C / m instead (``fedsim_strategies/numpy_noise.py``).
:func:`replace_one_account` does the same for DP-SGD's Poisson-sampled steps, where one record is
replaced by another (``fedsim_tasks/dp_sgd.py``).
"""

from __future__ import annotations

import logging
import math
import secrets
from dataclasses import dataclass, field
from functools import cache

import dp_accounting
import numpy as np
from dp_accounting import pld, rdp

logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting's convergence chatter


def clip_rows(vectors: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale every row to L2 norm at most ``clip_norm``."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-12))


def clamp_to_simplex(vector: np.ndarray) -> np.ndarray:
    """METHODS.md's post-processing: negatives to 0, renormalize (uniform if nothing is left)."""
    clamped = np.maximum(vector, 0.0)
    total = clamped.sum()
    return clamped / total if total > 0 else np.full_like(vector, 1.0 / len(vector))


@dataclass(frozen=True)
class NoiseSource:
    """Where a DP strategy's noise and client sampling come from.

    Private (the default): ``entropy`` is 256 bits nobody else knows (OS entropy, or a key derived
    from the run's secret so that a resumed run redraws the same noise, ``fedsim/privacy/secret.py``).
    Public (``privacy.reproducible_noise``, this machine only): ``entropy`` is the public seed, and
    anyone can regenerate the noise and subtract it: such a release is not private. Every draw
    names its purpose and index (``rng(RELEASE, round)``), so no two releases share noise.
    """

    entropy: int
    private: bool = True

    @classmethod
    def fresh(cls) -> NoiseSource:
        return cls(secrets.randbits(256))

    @classmethod
    def from_key(cls, key: bytes) -> NoiseSource:
        return cls(int.from_bytes(key, "big"))

    @classmethod
    def public(cls, seed: int) -> NoiseSource:
        return cls(int(seed), private=False)

    def rng(self, *labels: int) -> np.random.Generator:
        """An independent stream for one use (a release, a sweep point, a round's sample)."""
        return np.random.default_rng(np.random.SeedSequence(self.entropy, spawn_key=labels))


# a NoiseSource's uses, the first label of every stream (RELEASE, AUDIT: fedsim_strategies/dp_mean.py; SWEEP:
# FedTP's sweep; SAMPLE: DP client sampling; FLOWER_DP: fedsim_strategies/numpy_noise.py); the run's
# source is its privacy plan's (fedsim/privacy/plan.py)
RELEASE, SWEEP, SAMPLE, FLOWER_DP, AUDIT = 1, 2, 3, 4, 5
NOT_PRIVATE = (
    "privacy.reproducible_noise=true: the DP noise is drawn from the public seed, so "
    "anyone who knows the seed can remove it; these releases are NOT private"
)


def poisson_sample(nodes: list[int], rate: float, rng: np.random.Generator) -> list[int]:
    """Each node independently with probability ``rate``: the sampling the RDP accountant's
    amplification assumes (a fixed-size sample is another mechanism). The i-th node's coin is the
    i-th draw of ``rng``: one more node at the end leaves the others' coins as they were."""
    return [n for n, keep in zip(nodes, rng.random(len(nodes)) < rate) if keep]


@dataclass(frozen=True)
class Release:
    mean: np.ndarray
    num_clients: int
    noise_std: float  # std of the noise added to the sum
    noised: (
        np.ndarray
    )  # the noised mean before post-processing (the simplex step): what an audit checks
    labels: tuple[
        int, ...
    ] = ()  # the noise source's stream it drew from (an audit's attacker redraws it)


def clipped_sum(vectors: np.ndarray, clip_norm: float, non_negative: bool) -> np.ndarray:
    """What a release noises: the rows' sum, each row clipped to ``clip_norm`` (and, for rows of
    the simplex, its negative entries set to 0 first, which bounds two rows' distance by sqrt 2 C)."""
    rows = np.maximum(vectors, 0.0) if non_negative else vectors
    return clip_rows(rows, clip_norm).sum(axis=0)


def gaussian_noise(rng: np.random.Generator, std: float, size) -> np.ndarray:
    """One release's noise: N(0, std^2) per coordinate from ``rng``, none drawn at std 0. The
    one way it is drawn, so that an audit's attacker who knows the stream regenerates it."""
    return rng.normal(0.0, std, size=size) if std > 0 else np.zeros(size)


def gaussian_mean(
    vectors: np.ndarray,
    clip_norm: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    simplex: bool,
    denominator: float | None = None,
) -> Release:
    """Clip rows to ``clip_norm`` (on the ``simplex``, non-negative first), sum, add
    N(0, sigma^2 C^2 I), divide by ``denominator`` (default the row count; under Poisson sampling
    the expected count) and, on the ``simplex``, clamp back onto it. An empty matrix of ``dim``
    columns releases noise alone."""
    if vectors.ndim != 2 or (len(vectors) == 0 and not denominator):
        raise ValueError(f"need a non-empty (clients, dim) matrix, got shape {vectors.shape}")
    std = noise_multiplier * clip_norm
    total = clipped_sum(vectors, clip_norm, simplex) + gaussian_noise(rng, std, vectors.shape[1])
    mean = total / (denominator or len(vectors))
    return Release(clamp_to_simplex(mean) if simplex else mean, len(vectors), std, mean)


PLD_RESOLUTION = (
    1e-3  # the PLD's discretization step, as a share of the RDP epsilon (see :func:`account`)
)


@dataclass(frozen=True)
class Epsilon:
    """One guarantee's epsilon at one delta by dp-accounting's two accountants, from the same
    event: Renyi DP (``rdp.RdpAccountant``) and the privacy loss distribution
    (``pld.PLDAccountant``, pessimistic: an upper bound at any discretization, and the tighter one).
    Both are upper bounds, so the reported epsilon is the smaller."""

    rdp: float
    pld: float

    @property
    def reported(self) -> float:
        return min(self.rdp, self.pld)


ADD_OR_REMOVE, REPLACE_RECORD = (
    dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    dp_accounting.NeighboringRelation.REPLACE_ONE,
)


def account(event: dp_accounting.DpEvent, delta: float) -> Epsilon:
    """``event``'s epsilon at ``delta`` by both accountants (a Gaussian's noise multiplier is
    relative to the sensitivity: the accountants' add-or-remove relation, with the neighbours the
    caller chose folded into the multiplier)."""
    renyi = rdp.RdpAccountant()
    renyi.compose(event)
    by_rdp = float(renyi.get_epsilon(delta))
    if not 0 < by_rdp < math.inf:
        return Epsilon(by_rdp, by_rdp)
    return Epsilon(by_rdp, pld_epsilon(event, delta, ADD_OR_REMOVE, PLD_RESOLUTION * by_rdp))


def pld_epsilon(
    event: dp_accounting.DpEvent,
    delta: float,
    neighbours: dp_accounting.NeighboringRelation,
    step: float,
) -> float:
    """``event``'s epsilon at ``delta`` by dp-accounting's PLD accountant (pessimistic) for
    ``neighbours``, its losses discretized at ``step``. The step is ``PLD_RESOLUTION`` times an
    epsilon of the event: its rounding error stays a fixed share of the value at any scale, a few
    milliseconds per event, below RDP on every grid ``fedsim/privacy/test_dp.py`` tries (a fixed
    1e-4 took 2 min at epsilon 2,700; a fixed 1e-3 rose above RDP below epsilon 0.07)."""
    return float(
        pld.PLDAccountant(neighbours, value_discretization_interval=step)
        .compose(event)
        .get_epsilon(delta)
    )


# The orders alpha of the replace-one RDP bound: every half-integer to 32, then sparser to 256 (as
# dp-accounting's own grid thins out); 2 alpha - 1 and 2 alpha, where the add-or-remove curve is
# read, are then integers, at which dp-accounting's sampled Gaussian is an exact finite sum.
REPLACE_ONE_ORDERS = np.concatenate(
    [np.arange(3, 65) / 2, [40.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0]]
)


def replace_one_rdp(event: dp_accounting.DpEvent) -> np.ndarray:
    """An upper bound of ``event``'s Renyi DP at each of ``REPLACE_ONE_ORDERS`` for neighbours that
    replace one record by another, from dp-accounting's add-or-remove RDP, which has no such
    relation for Poisson-sampled events.

    D = D0 + {x} and D' = D0 + {x'}; R is the same mechanism (same rate, same divisor) on D0.
    Hoelder's inequality with exponents 2 and 2 gives, for any three distributions,
    D_alpha(P || Q) <= (alpha - 1/2) / (alpha - 1) D_2alpha(P || R) + D_(2alpha-1)(R || Q)
    (Mironov 2017, "Renyi Differential Privacy", the weak triangle inequality behind its group
    privacy; write P^alpha Q^(1-alpha) = [P^alpha R^(1/2-alpha)] [R^(alpha-1/2) Q^(1-alpha)]).
    P, R differ by removing x and R, Q by adding x': add-or-remove neighbours, the adding
    direction no larger than the removing one that dp-accounting computes for a sampled Gaussian
    (Mironov, Talwar & Zhang 2019, "Renyi DP of the Sampled Gaussian Mechanism"; checked by
    quadrature in ``fedsim/privacy/test_dp.py``). Composition adds each side's RDP, so the bound
    holds for a whole composed (adaptive) event. Hand-written because dp-accounting's RDP
    accountant refuses REPLACE_ONE for Poisson sampling. Loose: 2 to 6 times the PLD's epsilon at
    DP-SGD's rates (more at tiny epsilons), but at rate 1 within 1 + 1 / (4 alpha (alpha - 1)) of
    the exact curve."""
    alpha = REPLACE_ONE_ORDERS
    removing = rdp.RdpAccountant(np.concatenate([2 * alpha, 2 * alpha - 1])).compose(event).rdp
    return (alpha - 0.5) / (alpha - 1) * removing[: len(alpha)] + removing[len(alpha) :]


def replace_one_account(event: dp_accounting.DpEvent, delta: float) -> Epsilon:
    """``event``'s epsilon at ``delta`` for neighbours that replace one record by another, whose
    Poisson sampling (a ``PoissonSampledDpEvent``) is of the records themselves, so that the relation
    cannot be folded into a multiplier: RDP from :func:`replace_one_rdp` (dp-accounting's
    conversion to epsilon), PLD from dp-accounting's ``REPLACE_ONE`` (the sampled step's sum at
    -C and at +C along one record's gradient, each with probability the rate), its step a share
    of its own epsilon (found by a first pass at a share of the RDP bound, which can be 20 times
    larger: the reported epsilon then sits as close to a calibrated target as the PLD allows)."""
    by_rdp = float(rdp.compute_epsilon(REPLACE_ONE_ORDERS, replace_one_rdp(event), delta)[0])
    if not 0 < by_rdp < math.inf:
        return Epsilon(by_rdp, by_rdp)
    rough = pld_epsilon(
        event, delta, REPLACE_RECORD, PLD_RESOLUTION * by_rdp
    )  # the bound is loose: a coarse step
    return Epsilon(
        by_rdp,
        pld_epsilon(event, delta, REPLACE_RECORD, PLD_RESOLUTION * rough) if rough > 0 else rough,
    )


REPLACE_ONE = (
    2.0  # how far one client moves a sum of rows clipped to C when its row is replaced, in C
)
NON_NEGATIVE = math.sqrt(
    2.0
)  # the same for non-negative rows: |x - x'|^2 = |x|^2 + |x'|^2 - 2 x.x' <= 2 C^2


@cache
def release_epsilon(
    noise_multiplier: float, delta: float, releases: int, sensitivity: float = REPLACE_ONE
) -> Epsilon:
    """Epsilon after ``releases`` Gaussian releases of a clipped sum with noise std sigma C, for
    neighbours that differ in one client's row (replace one), with no amplification by sampling.

    Why replace-one: every DP release fedsim makes divides by, and its results publish, the number
    of rows that went in (results.json's per-round client counts and fault counts, FedTP's prior
    count, the mean's divisor). Under add-or-remove-one that count tells a neighbour apart at once,
    so the add-or-remove bound holds for nothing fedsim publishes; between replace-one neighbours
    the count, and who was sampled, are the same, so the bound holds with all of it public. One
    client then moves the sum by up to ``sensitivity`` C (2 C; sqrt 2 C for non-negative rows),
    each release is a Gaussian mechanism at noise multiplier sigma / sensitivity, and sampling
    gives no amplification: the realized count says how likely it was that a client was in.
    """
    if noise_multiplier <= 0:
        return Epsilon(math.inf, math.inf)
    if releases == 0:
        return Epsilon(0.0, 0.0)
    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier / sensitivity)
    return account(dp_accounting.SelfComposedDpEvent(gaussian, releases), delta)


def adaptive_noise_multiplier(update_noise_multiplier: float, clipped_count_stddev: float) -> float:
    """The noise multiplier of one adaptive-clipping round, the model update's noise and the
    clipped count's together (Andrew et al. 2021, "Differentially private learning with adaptive
    clipping", Thm. 1): (z_update^-2 + (2 sigma_count)^-2)^-1/2. Flower
    (``compute_adaptive_noise_params``) and TF-privacy (``QuantileAdaptiveClipSumQuery``) solve
    the same equation for z_update, given this multiplier. The 2: the paper's count sums bits
    centred at 1/2, which one client moves by 1/2. Flower counts 0/1 bits over the m replies;
    with m known, as the mean's divisor is, that count and the centred one are one release."""
    if update_noise_multiplier <= 0:
        return 0.0  # the update goes out unnoised: no guarantee, whatever the count's noise
    return (update_noise_multiplier**-2 + (2 * clipped_count_stddev) ** -2) ** -0.5


SAMPLING = (
    "none claimed: every round is accounted as a Gaussian release without amplification "
    "by sampling. With a strategy's fraction_train < 1 each client is in a round on its own "
    "coin at that rate (Poisson sampling, fedsim_strategies/numpy_noise.py), drawn from the "
    "run's secret noise source: the public seed does not tell who trained. Amplification "
    "would need the number of replies kept secret, and results.json publishes it (the mean's "
    "divisor, the fault counts)"
)
COVERS = (
    "replacing one client's whole contribution (its updates in every round) by another's, "
    "in the released global models and, under adaptive clipping, the clipping norm, with "
    "everything else the run publishes known (the number of clients each round averaged, the "
    "fault counts, who was sampled); not what the strategy aggregates without noise (train "
    "metrics, update norms in results.json and metrics.csv), not whether a client took part "
    "(the counts show it), and not against the server, which sees every client's update"
)
ACCOUNTANT = (
    "replace-one client (sensitivity 2 C: the noise multiplier accounted is sigma / 2), no "
    "amplification by sampling; epsilon_rdp by dp-accounting's RdpAccountant, epsilon_pld by "
    "its PLDAccountant (pessimistic), epsilon the smaller"
)


@dataclass
class CentralDP:
    """What a run's central-DP releases spent: Flower's DP wrappers, one release per aggregated
    round (``fedsim_strategies/numpy_noise.py``), per phase (a strategy's rounds, e.g. one
    method's model) and over the whole run (every phase composed: what publishing all the
    run's models costs). Accounted by :func:`release_epsilon` at ``delta`` at the wrapper's
    (effective) ``noise_multiplier``: model updates are signed, so replacing one client moves
    the sum of clipped updates by up to 2 C (under adaptive clipping, its clipped-count bit by
    up to 1: both twice their add-or-remove reach, so the effective multiplier halves as well)."""

    delta: float
    mechanism: str  # the wrapper's class name
    noise_multiplier: float  # per round; adaptive: update and clipped count together
    releases: dict[str, int] = field(default_factory=dict)  # phase -> rounds released

    def record(self, phase: str) -> float:
        """One more release of ``phase``; the phase's epsilon so far."""
        self.releases[phase] = self.releases.get(phase, 0) + 1
        return self.epsilon(self.releases[phase]).reported

    def epsilon(self, releases: int) -> Epsilon:
        return release_epsilon(self.noise_multiplier, self.delta, releases)

    def report(self) -> dict:
        """results.json's ``privacy.central_dp``: the guarantee, its assumptions, per phase the
        epsilon after each round, and the run's total; each ``epsilon`` the smaller of
        ``epsilon_rdp`` and ``epsilon_pld`` beside it."""

        def spent(releases: int) -> dict:
            eps = self.epsilon(releases)
            return {"epsilon": eps.reported, "epsilon_rdp": eps.rdp, "epsilon_pld": eps.pld}

        total = sum(self.releases.values())
        return {
            "mechanism": self.mechanism,
            "noise_multiplier": self.noise_multiplier,
            "delta": self.delta,
            "accountant": ACCOUNTANT,
            "amplification_by_sampling": SAMPLING,
            "covers": COVERS,
            "epsilon_per_round": self.epsilon(1).reported,
            "phases": {
                phase: {
                    "rounds": n,
                    **spent(n),
                    "epsilon_by_round": [self.epsilon(t).reported for t in range(1, n + 1)],
                }
                for phase, n in self.releases.items()
            },
            "rounds": total,
            **spent(total),
        }
