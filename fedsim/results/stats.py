"""Paired comparisons: two systems on the same items (a bootstrap over items, or over the
clusters they come in: the task's unit, ``task.unit``), and the power of a paired comparison
over seeds (minimum detectable effect, seeds needed, verdict)."""

from __future__ import annotations

import numpy as np
from scipy import optimize, stats

from fedsim.config.schema import SPENDING


def paired_bootstrap_ci(
    diff: np.ndarray, resamples: int, seed: int, level: float = 0.95
) -> tuple[float, float]:
    """Percentile CI of mean(diff), resampling items (turns) with replacement
    (``scipy.stats.bootstrap``, in batches of 256 resamples: memory stays at 256 x items)."""
    diff = np.asarray(diff, float)
    if diff.size == 0:
        raise ValueError("no paired items to bootstrap")
    ci = stats.bootstrap(
        (diff,),
        np.mean,
        n_resamples=resamples,
        batch=256,
        method="percentile",
        confidence_level=level,
        rng=np.random.default_rng(seed),
    ).confidence_interval
    return float(ci.low), float(ci.high)


def cluster_mean_ci(
    values: np.ndarray, clusters: np.ndarray, resamples: int, seed: int, level: float = 0.95
) -> tuple[float, float]:
    """Percentile CI of mean(values) over all items, resampling whole clusters (``clusters[i]``
    names item i's: a conversation, a client) with replacement. Items of one cluster share its
    data (a conversation's prior and candidates), so they are not independent draws and a
    bootstrap over items is too narrow. The statistic is the pooled ratio, the items' sum over
    the resampled clusters divided by their item count: that is the point estimate reported
    (EHR over all test turns), not the mean of cluster means, which would weigh a two-turn
    conversation like a forty-turn one."""
    values = np.asarray(values, float)
    keys, inverse = np.unique(clusters, return_inverse=True)
    totals = np.stack(
        [np.bincount(inverse, values, keys.size), np.bincount(inverse, minlength=keys.size)], 1
    )
    return cluster_bootstrap_ci(totals, lambda t: t[..., 0] / t[..., 1], resamples, seed, level)


def cluster_pearson_ci(
    x: np.ndarray,
    y: np.ndarray,
    clusters: np.ndarray,
    resamples: int,
    seed: int,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile CI of Pearson's r of the pooled (x, y) items, resampling whole clusters (a
    client's rounds) with replacement: Fisher's z would count every item as independent. nan
    where a resample has no spread in x or y (a few clusters, one of them constant)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keys, inverse = np.unique(clusters, return_inverse=True)
    totals = np.stack(
        [np.bincount(inverse, w, keys.size) for w in (np.ones_like(x), x, y, x * x, y * y, x * y)],
        1,
    )

    def pearson(t: np.ndarray) -> np.ndarray:
        n, sx, sy, sxx, syy, sxy = np.moveaxis(t, -1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (n * sxy - sx * sy) / np.sqrt((n * sxx - sx * sx) * (n * syy - sy * sy))

    return cluster_bootstrap_ci(totals, pearson, resamples, seed, level)


def cluster_bootstrap_ci(
    totals: np.ndarray, pooled, resamples: int, seed: int, level: float = 0.95
) -> tuple[float, float]:
    """Percentile CI of ``pooled(summed totals)`` where ``totals`` holds one row of additive
    sums per cluster: ``scipy.stats.bootstrap`` resamples the cluster indices (it has no
    clusters of its own), and each resample's statistic adds the picked clusters' rows, so a
    batch of 256 resamples costs 256 x clusters x sums, not items."""
    totals = np.asarray(totals, float)
    if len(totals) < 2:
        raise ValueError(f"a cluster bootstrap needs at least 2 clusters, got {len(totals)}")

    def statistic(picked: np.ndarray, axis: int = -1) -> np.ndarray:
        return pooled(totals[np.moveaxis(picked, axis, -1).astype(int)].sum(axis=-2))

    ci = stats.bootstrap(
        (np.arange(len(totals)),),
        statistic,
        n_resamples=resamples,
        batch=256,
        vectorized=True,
        method="percentile",
        confidence_level=level,
        rng=np.random.default_rng(seed),
    ).confidence_interval
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
    return {
        "groups": int(gains.size),
        "improved": int(np.sum(gains > tol)),
        "worsened": int(np.sum(gains < -tol)),
        "unchanged": int(np.sum(np.abs(gains) <= tol)),
        "mean_gain": float(gains.mean()) if gains.size else 0.0,
    }


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


# Looks at a sweep before its planned seeds: Lan-DeMets alpha spending (Lan & DeMets 1983,
# Biometrika 70:659; DeMets & Lan 1994, Stat Med 13:1341). Written here, by hand, because no
# maintained Python library computes it: PyPI's gsdesign (0.1.x, "experimental") holds only the
# integration grid and no spending function or boundary search; gsmethods ships no code.

BOUNDARY_GRID = 501  # points of the recursive integration: boundaries agree with 2001 to 1e-4


def alpha_spent(fraction, alpha: float, spending: str) -> np.ndarray:
    """The two-sided type I error spent by information fraction ``fraction`` (0 < t <= 1;
    ``alpha`` at 1). ``obrien_fleming``: each side spends alpha/2 as Lan-DeMets' O'Brien-Fleming
    type 2 - 2 Phi(z_{alpha/4} / sqrt(t)) (gsDesign's sfLDOF per side, the boundaries of DeMets
    & Lan 1994); ``pocock``: alpha ln(1 + (e - 1) t)."""
    t = np.asarray(fraction, float)
    if spending == "obrien_fleming":
        return 4.0 - 4.0 * stats.norm.cdf(stats.norm.isf(alpha / 4.0) / np.sqrt(t))
    if spending == "pocock":
        return alpha * np.log1p((np.e - 1.0) * t)
    raise ValueError(f"alpha spending {spending!r}: one of {SPENDING}")


def _simpson_weights(x: np.ndarray) -> np.ndarray:
    w = np.ones(x.size)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w * (x[-1] - x[0]) / (3.0 * (x.size - 1))


def sequential_bounds(fractions, alpha: float, spending: str) -> list[float]:
    """Two-sided symmetric z boundaries c_k at looks with information ``fractions`` (increasing,
    the last <= 1): P(|Z_j| < c_j for j < k, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1}) under
    the null, where Z_k = S_k / sqrt(t_k) and S has independent normal increments (corr(Z_j, Z_k)
    = sqrt(t_j / t_k)). Solved look by look by recursive numerical integration of the density
    of S on the continuation region (Armitage, McPherson & Rowe 1969; Simpson's rule)."""
    t = np.asarray(fractions, float)
    if t.size == 0 or np.any(np.diff(t) <= 0) or t[0] <= 0 or t[-1] > 1:
        raise ValueError(f"information fractions must increase within (0, 1], got {list(t)}")
    spent = alpha_spent(t, alpha, spending)
    bounds = [float(stats.norm.isf(spent[0] / 2.0))]
    s = np.linspace(-1.0, 1.0, BOUNDARY_GRID) * bounds[0] * np.sqrt(t[0])
    density = stats.norm.pdf(s, scale=np.sqrt(t[0]))
    for k in range(1, t.size):
        step = np.sqrt(t[k] - t[k - 1])
        mass = density * _simpson_weights(s)

        def excess(c, s=s, mass=mass, step=step, k=k):
            """The null probability of stopping first at look k, minus what look k may spend."""
            edge = c * np.sqrt(t[k])
            exits = mass @ (stats.norm.sf((edge - s) / step) + stats.norm.cdf((-edge - s) / step))
            return exits - (spent[k] - spent[k - 1])

        c = optimize.brentq(excess, 0.01, 40.0, xtol=1e-10)
        bounds.append(float(c))
        y = np.linspace(-1.0, 1.0, BOUNDARY_GRID) * c * np.sqrt(t[k])
        density = stats.norm.pdf((y[:, None] - s[None, :]) / step) / step @ mass
        s = y
    return bounds


def holm(p_values, alpha: float) -> tuple[list[bool], list[float]]:
    """Holm's step-down adjustment (statsmodels ``multipletests``): which hypotheses are
    rejected at family-wise ``alpha``, and the adjusted p values."""
    from statsmodels.stats.multitest import (
        multipletests,
    )  # only when asked: the import takes seconds

    if len(p_values) == 0:
        return [], []
    reject, adjusted, _, _ = multipletests(np.asarray(p_values, float), alpha=alpha, method="holm")
    return [bool(r) for r in reject], [float(p) for p in adjusted]
