"""Paired comparisons: two systems on the same items (a bootstrap over turns or prompts), and
the power of a paired comparison over seeds (minimum detectable effect, seeds needed, verdict)."""

from __future__ import annotations

import numpy as np
from scipy import stats


def paired_bootstrap_ci(diff: np.ndarray, resamples: int, seed: int,
                        level: float = 0.95) -> tuple[float, float]:
    """Percentile CI of mean(diff), resampling items (turns) with replacement
    (``scipy.stats.bootstrap``, in batches of 256 resamples: memory stays at 256 x items)."""
    diff = np.asarray(diff, float)
    if diff.size == 0:
        raise ValueError("no paired items to bootstrap")
    ci = stats.bootstrap((diff,), np.mean, n_resamples=resamples, batch=256, method="percentile",
                         confidence_level=level, rng=np.random.default_rng(seed)).confidence_interval
    return float(ci.low), float(ci.high)


def group_gains(groups: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per group (e.g. conversation): mean(b) - mean(a) over its items."""
    keys, inverse = np.unique(groups, return_inverse=True)
    counts = np.bincount(inverse)
    return (np.bincount(inverse, b) - np.bincount(inverse, a)) / counts


GAIN_TOL = 1e-12  # a gain this close to 0 is "unchanged" (float sums of equal hit counts)


def t_interval(x: np.ndarray, level: float) -> tuple[float, float] | None:
    """Student t CI of the mean of ``x`` (one value per seed); None with fewer than two values
    or no spread: a constant over seeds supports no interval."""
    x = np.asarray(x, float)
    if x.size < 2 or np.ptp(x) == 0:
        return None
    lo, hi = stats.t.interval(level, x.size - 1, loc=x.mean(), scale=stats.sem(x))
    return float(lo), float(hi)


def gain_distribution(gains: np.ndarray, tol: float = GAIN_TOL) -> dict:
    return {"groups": int(gains.size), "improved": int(np.sum(gains > tol)),
            "worsened": int(np.sum(gains < -tol)), "unchanged": int(np.sum(np.abs(gains) <= tol)),
            "mean_gain": float(gains.mean()) if gains.size else 0.0}


# Power of a paired comparison over seeds: a one-sample t-test on the per-seed differences.
# statsmodels' TTestPower solves the noncentral t exactly (what a hand formula approximates).

def detectable_effect(sd: float, n: int, level: float, power: float) -> float | None:
    """The minimum detectable effect: the smallest true mean difference that a two-sided
    paired t-test over ``n`` seeds at alpha = 1 - ``level`` finds with probability ``power``,
    when the differences spread with standard deviation ``sd``. None below two seeds or
    without spread."""
    from statsmodels.stats.power import TTestPower  # only when asked: the import takes seconds

    if n < 2 or not sd > 0:
        return None
    d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=1.0 - level, power=power)
    return float(d * sd)


def seeds_needed(effect: float, sd: float, level: float, power: float) -> int | None:
    """The fewest seeds (at least 2) whose paired t-test finds a true difference ``effect``
    with probability ``power`` at the spread ``sd``; None without spread or effect. Searched on
    the detectable effect's side (doubling, then bisection): statsmodels' solve for n fails
    near 2-3 seeds, where scipy's noncentral t is not finite for large effects."""
    if not sd > 0 or effect == 0:
        return None

    def enough(n: int) -> bool:
        return detectable_effect(sd, n, level, power) <= abs(effect)

    high = 2
    while not enough(high):
        high *= 2
    low = high // 2  # not enough (or 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def detectable_effect_of_interval(ci: tuple[float, float], level: float, power: float) -> float:
    """The minimum detectable effect of a large-sample interval (a bootstrap over thousands of
    items): its standard error from the half-width, then (z_{1-a/2} + z_power) x SE."""
    z = stats.norm.ppf(0.5 + level / 2.0)
    return float((z + stats.norm.ppf(power)) * (ci[1] - ci[0]) / (2.0 * z))


VERDICTS = ("shown", "excluded", "inconclusive")


def verdict(ci: tuple[float, float] | None, effect: float | None) -> str | None:
    """``shown`` when the CI excludes 0; else ``excluded`` when it excludes ``effect`` (the
    effect of interest, signed: the CI lies wholly on 0's side of it); else ``inconclusive``.
    None without a CI: no claim."""
    if ci is None:
        return None
    lo, hi = ci
    if lo > 0.0 or hi < 0.0:
        return "shown"
    if effect is not None and (hi < effect if effect > 0 else lo > effect):
        return "excluded"
    return "inconclusive"
