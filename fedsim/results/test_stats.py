import numpy as np
import pytest
from scipy import stats

from fedsim.results.stats import (
    cluster_mean_ci,
    cluster_pearson_ci,
    gain_distribution,
    group_gains,
    paired_bootstrap_ci,
)


def test_bootstrap_ci_brackets_the_mean_and_is_deterministic():
    rng = np.random.default_rng(0)
    diff = rng.choice([-1.0, 0.0, 1.0], size=2000, p=[0.1, 0.7, 0.2])
    lo, hi = paired_bootstrap_ci(diff, 2000, seed=3)
    assert lo < diff.mean() < hi
    assert hi - lo == pytest.approx(2 * 1.96 * diff.std() / np.sqrt(diff.size), rel=0.15)
    assert (lo, hi) == paired_bootstrap_ci(diff, 2000, seed=3)


def test_bootstrap_ci_of_constant_is_a_point():
    assert paired_bootstrap_ci(np.zeros(10), 100, 0) == (0.0, 0.0)


def test_group_gains_and_distribution():
    groups = np.array([5, 5, 7, 9, 9])
    a = np.array([1, 0, 1, 0, 0.0])
    b = np.array([1, 1, 0, 0, 0.0])
    gains = group_gains(groups, a, b)
    np.testing.assert_allclose(gains, [0.5, -1.0, 0.0])
    d = gain_distribution(gains)
    assert (d["improved"], d["worsened"], d["unchanged"], d["groups"]) == (1, 1, 1, 3)


def _clustered(rng, clusters: int, items: int) -> tuple[np.ndarray, np.ndarray]:
    """Items around a true mean of 0 whose cluster adds a shared shift (sd 1, items' own sd 1):
    an intra-cluster correlation of 0.5."""
    groups = np.repeat(np.arange(clusters), items)
    return rng.normal(size=clusters)[groups] + rng.normal(size=groups.size), groups


def test_cluster_bootstrap_covers_where_the_item_bootstrap_does_not():
    """60 clusters x 20 items, a strong cluster effect, the true mean 0: over 300 simulated sets
    the item bootstrap's 95% CI holds 0 far less often than 90% of the time (it treats 1,200
    items as independent), the cluster bootstrap's about 95%."""
    rng = np.random.default_rng(58)
    item = cluster = 0
    for rep in range(300):
        values, groups = _clustered(rng, 60, 20)
        lo, hi = paired_bootstrap_ci(values, 300, seed=rep)
        item += lo <= 0.0 <= hi
        lo, hi = cluster_mean_ci(values, groups, 300, seed=rep)
        cluster += lo <= 0.0 <= hi
    assert item / 300 < 0.90
    assert 0.92 <= cluster / 300 <= 0.98


def test_cluster_mean_ci_is_the_pooled_ratio_and_deterministic():
    """Unequal clusters: the CI brackets the mean over items (what the run reports), not the
    mean of cluster means; clusters of one item each give the item bootstrap's interval."""
    groups = np.array([0] * 30 + [1, 2, 3, 4] * 2 + list(range(5, 40)))
    values = np.where(groups == 0, 1.0, 0.0) + np.random.default_rng(1).normal(0, 0.1, groups.size)
    lo, hi = cluster_mean_ci(values, groups, 2000, seed=3)
    assert lo < values.mean() < hi
    assert (lo, hi) == cluster_mean_ci(values, groups, 2000, seed=3)
    singletons = np.arange(values.size)
    assert cluster_mean_ci(values, singletons, 2000, seed=3) == pytest.approx(
        paired_bootstrap_ci(values, 2000, 3), abs=0.02
    )
    with pytest.raises(ValueError, match="at least 2 clusters"):
        cluster_mean_ci(values, np.zeros(values.size), 100, seed=0)


def test_cluster_pearson_ci_widens_with_the_clusters_rounds():
    """Rounds of a client repeat its (x, y) with small jitter: Pearson's r over client-rounds
    by Fisher's z counts 10 x 12 points, the cluster bootstrap 12 clients, so it is wider and
    brackets r."""
    rng = np.random.default_rng(5)
    clients = np.repeat(np.arange(12), 10)
    x = rng.normal(size=12)[clients] + rng.normal(0, 0.05, clients.size)
    y = 0.3 * x + rng.normal(size=12)[clients] + rng.normal(0, 0.05, clients.size)
    r = stats.pearsonr(x, y)
    fisher = r.confidence_interval(0.95)
    lo, hi = cluster_pearson_ci(x, y, clients, 2000, seed=0)
    assert lo < r.statistic < hi
    assert hi - lo > 2 * (fisher.high - fisher.low)
