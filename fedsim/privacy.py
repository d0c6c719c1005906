"""Client-level Gaussian mechanism for a mean of vectors, and its epsilon.

Clipping, noising and the simplex step are a few lines of numpy: Flower's DP wrappers clip and
noise whole FedAvg model updates and cannot release a mean of arbitrary vectors with a custom
post-processing step, so this module does only that, and leaves accounting to Flower's
``RdpAccountant`` (backed by Google's dp-accounting).
"""

from __future__ import annotations

import logging
import math
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
) -> Release:
    """Clip rows to ``clip_norm``, sum, add N(0, sigma^2 C^2 I), divide by the row count."""
    if vectors.ndim != 2 or len(vectors) == 0:
        raise ValueError(f"need a non-empty (clients, dim) matrix, got shape {vectors.shape}")
    std = noise_multiplier * clip_norm
    total = clip_rows(vectors, clip_norm).sum(axis=0)
    if std > 0:
        total = total + rng.normal(0.0, std, size=total.shape)
    mean = total / len(vectors)
    return Release(clamp_to_simplex(mean) if simplex else mean, len(vectors), std)


def one_shot_epsilon(noise_multiplier: float, delta: float) -> float:
    """Classic Gaussian mechanism: epsilon = sqrt(2 ln(1.25 / delta)) / sigma (inf at sigma=0)."""
    if noise_multiplier <= 0:
        return math.inf
    return math.sqrt(2.0 * math.log(1.25 / delta)) / noise_multiplier


def rdp_epsilon(
    noise_multiplier: float, delta: float, rounds: int, sample_size: int, population: int
) -> float:
    """Epsilon after ``rounds`` releases by Flower's RDP accountant.

    Full participation is accounted with no amplification; a sampled round as Poisson
    sampling with rate sample_size / population (the usual DP-FedAvg accounting).
    """
    if noise_multiplier <= 0:
        return math.inf
    sampled = sample_size < population
    method = SamplingMethod.POISSON if sampled else SamplingMethod.NO_AMPLIFICATION
    accountant = RdpAccountant(
        PrivacyConfig(delta, population, NeighboringRelation.ADD_OR_REMOVE_ONE, method)
    )
    accountant.compose(GaussianPrivacyEvent(noise_multiplier, sample_size, population), rounds)
    return accountant.get_epsilon(delta)
