"""Group-sequential boundaries against published tables, and Holm against statsmodels."""

import numpy as np
import pytest
from scipy import stats as scipy_stats

from fedsim.results.stats import alpha_spent, holm, sequential_bounds

# Two-sided alpha 0.05, equally spaced looks, Lan-DeMets spending (DeMets & Lan 1994, Stat Med
# 13:1341, Table I; gsDesign's sfLDOF / sfLDPocock with alpha 0.025 a side, test.type 2). The
# classic O'Brien-Fleming design (not spending) differs: K=5 4.562, 3.226, 2.634, 2.281, 2.040.
OBRIEN_FLEMING = {
    3: [3.710, 2.511, 1.993],
    4: [4.333, 2.963, 2.359, 2.014],
    5: [4.877, 3.357, 2.680, 2.290, 2.031],
}
POCOCK = {5: [2.438, 2.427, 2.410, 2.397, 2.386]}


@pytest.mark.parametrize("spending,table", [("obrien_fleming", OBRIEN_FLEMING), ("pocock", POCOCK)])
def test_lan_demets_boundaries_equal_the_published_table_to_3_decimals(spending, table):
    for looks, published in table.items():
        bounds = sequential_bounds(np.arange(1, looks + 1) / looks, 0.05, spending)
        assert np.round(bounds, 3).tolist() == published, (spending, looks, bounds)


def test_the_boundaries_spend_what_the_function_allows_by_an_independent_integration():
    """scipy's multivariate normal (Genz's quasi-Monte Carlo, corr sqrt(t_j / t_k)) finds the
    spent alpha at the recursive integration's boundaries."""
    t = np.array([0.3, 0.7, 1.0])
    bounds = np.array(sequential_bounds(t, 0.05, "obrien_fleming"))
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    for k in (2, 3):
        inside = scipy_stats.multivariate_normal(np.zeros(k), cov[:k, :k], seed=0).cdf(
            bounds[:k], lower_limit=-bounds[:k]
        )
        assert 1.0 - inside == pytest.approx(
            alpha_spent(t[k - 1], 0.05, "obrien_fleming"), abs=2e-5
        )


def test_one_look_at_the_planned_seeds_is_the_nominal_test():
    assert sequential_bounds([1.0], 0.05, "obrien_fleming") == pytest.approx(
        [scipy_stats.norm.isf(0.025)]
    )
    assert alpha_spent(1.0, 0.05, "pocock") == pytest.approx(0.05)


def test_fractions_that_do_not_increase_within_one_are_refused():
    for bad in ([0.5, 0.5], [0.5, 1.2], [0.0, 1.0], []):
        with pytest.raises(ValueError, match="information fractions"):
            sequential_bounds(bad, 0.05, "pocock")


def test_holm_equals_statsmodels():
    from statsmodels.stats.multitest import multipletests

    p = [0.049, 0.001, 0.03, 0.2, 0.012]
    reject, adjusted = holm(p, 0.05)
    expected = multipletests(p, alpha=0.05, method="holm")
    assert reject == expected[0].tolist() and adjusted == pytest.approx(expected[1].tolist())
    assert adjusted == pytest.approx(
        [0.098, 0.005, 0.09, 0.2, 0.048]
    )  # by hand: p_(i) x (m - i + 1), monotone
    assert holm([], 0.05) == ([], [])
