"""Paired comparisons of two systems evaluated on the same items."""

from __future__ import annotations

import numpy as np


def paired_bootstrap_ci(diff: np.ndarray, resamples: int, seed: int,
                        level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of mean(diff), resampling items (turns) with replacement."""
    diff = np.asarray(diff, float)
    if diff.size == 0:
        raise ValueError("no paired items to bootstrap")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, 256):  # chunks keep memory at 256 x items
        stop = min(resamples, start + 256)
        means[start:stop] = diff[rng.integers(0, diff.size, (stop - start, diff.size))].mean(1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [tail, 1.0 - tail])
    return float(lo), float(hi)


def group_gains(groups: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per group (e.g. conversation): mean(b) - mean(a) over its items."""
    keys, inverse = np.unique(groups, return_inverse=True)
    counts = np.bincount(inverse)
    return (np.bincount(inverse, b) - np.bincount(inverse, a)) / counts


def gain_distribution(gains: np.ndarray, tol: float = 1e-12) -> dict:
    return {"groups": int(gains.size), "improved": int(np.sum(gains > tol)),
            "worsened": int(np.sum(gains < -tol)), "unchanged": int(np.sum(np.abs(gains) <= tol)),
            "mean_gain": float(gains.mean()) if gains.size else 0.0}
