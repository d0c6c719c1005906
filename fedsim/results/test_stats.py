import numpy as np
import pytest

from fedsim.results.stats import gain_distribution, group_gains, paired_bootstrap_ci


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
