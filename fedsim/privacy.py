"""Client-level Gaussian mechanism for a mean of vectors, and its epsilon.

Clipping, noising and the simplex step are a few lines of numpy: Flower's DP wrappers clip and
noise whole FedAvg model updates and cannot release a mean of arbitrary vectors with a custom
post-processing step, so this module does only that, and leaves accounting to Flower's
``RdpAccountant`` (backed by Google's dp-accounting).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import Counter
from dataclasses import dataclass

import numpy as np
from flwr.serverapp import GaussianPrivacyEvent, PrivacyConfig, RdpAccountant, SamplingMethod
from flwr.supercore.privacy_accounting import NeighboringRelation

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
    from the run's secret so that a resumed run redraws the same noise, ``fedsim/secret.py``).
    Public (``privacy.reproducible_noise``, simulation only): ``entropy`` is the public seed, and
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


RELEASE, SWEEP, SAMPLE, FLOWER_DP = 1, 2, 3, 4  # a NoiseSource's uses (FLOWER_DP: fedsim_strategies/numpy_noise.py)
NOT_PRIVATE = ("privacy.reproducible_noise=true: the DP noise is drawn from the public seed, so "
               "anyone who knows the seed can remove it; these releases are NOT private")


def poisson_sample(nodes: list[int], rate: float, rng: np.random.Generator) -> list[int]:
    """Each node independently with probability ``rate``: the sampling the RDP accountant's
    amplification assumes (a fixed-size sample is another mechanism)."""
    return [n for n, keep in zip(nodes, rng.random(len(nodes)) < rate) if keep]


@dataclass(frozen=True)
class Release:
    mean: np.ndarray
    num_clients: int
    noise_std: float  # std of the noise added to the sum


def gaussian_mean(
    vectors: np.ndarray,
    clip_norm: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    simplex: bool,
    denominator: float | None = None,
) -> Release:
    """Clip rows to ``clip_norm``, sum, add N(0, sigma^2 C^2 I), divide by ``denominator``
    (default the row count; under Poisson sampling the expected count, so that the divisor does
    not reveal who was sampled). An empty matrix of ``dim`` columns releases noise alone."""
    if vectors.ndim != 2 or (len(vectors) == 0 and not denominator):
        raise ValueError(f"need a non-empty (clients, dim) matrix, got shape {vectors.shape}")
    std = noise_multiplier * clip_norm
    total = clip_rows(vectors, clip_norm).sum(axis=0)
    if std > 0:
        total = total + rng.normal(0.0, std, size=total.shape)
    mean = total / (denominator or len(vectors))
    return Release(clamp_to_simplex(mean) if simplex else mean, len(vectors), std)


def one_shot_epsilon(noise_multiplier: float, delta: float) -> float:
    """Classic Gaussian mechanism: epsilon = sqrt(2 ln(1.25 / delta)) / sigma (inf at sigma=0)."""
    if noise_multiplier <= 0:
        return math.inf
    return math.sqrt(2.0 * math.log(1.25 / delta)) / noise_multiplier


def rdp_epsilon(
    noise_multiplier: float, delta: float, rounds: int, sample_size: int, population: int
) -> float:
    """Epsilon after ``rounds`` identical releases by Flower's RDP accountant."""
    return rdp_epsilon_rounds(noise_multiplier, delta, [(sample_size, population)] * rounds)


def rdp_epsilon_rounds(noise_multiplier: float, delta: float, rounds: list[tuple[int, int]]) -> float:
    """Epsilon after one release per ``(sample_size, population)`` of ``rounds``, each accounted
    at its own rate: Poisson sampling at rate sample_size / population (what
    :func:`poisson_sample` does; rate 1 is full participation, no amplification)."""
    if noise_multiplier <= 0:
        return math.inf
    if not rounds:
        return 0.0
    populations = {population for _, population in rounds}
    if len(populations) != 1:
        raise ValueError(f"rounds over different populations {sorted(populations)}: the RDP "
                         "accountant composes releases over one population")
    accountant = RdpAccountant(PrivacyConfig(delta, populations.pop(),
                                             NeighboringRelation.ADD_OR_REMOVE_ONE,
                                             SamplingMethod.POISSON))
    for (size, population), count in Counter(rounds).items():  # equal rounds composed at once
        accountant.compose(GaussianPrivacyEvent(noise_multiplier, size, population), count)
    return accountant.get_epsilon(delta)
