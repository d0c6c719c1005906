"""The epsilon fedsim reports for its central-DP releases (replace-one neighbours, no
amplification by sampling, by RDP and by PLD), checked against computations that share no code
with the accountants and against dp-accounting's own replace-one relation; the replace-one
account of Poisson-sampled steps (DP-SGD's records), its RDP bound checked by quadrature; and
the refusals of a DP config whose (epsilon, delta) would mean nothing."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.stats import norm

from fedsim.config.compose import compose
from fedsim.config.schema import check
from fedsim.flower.strategies import compute_adaptive_noise_params
from fedsim.privacy.dp import (
    NON_NEGATIVE,
    REPLACE_ONE_ORDERS,
    CentralDP,
    account,
    adaptive_noise_multiplier,
    clipped_sum,
    release_epsilon,
    replace_one_account,
    replace_one_rdp,
)

DELTA = 1e-5


def gaussian_rdp_epsilon(sigma: float, delta: float, releases: int) -> float:
    """By hand: ``releases`` Gaussian mechanisms have RDP T alpha / (2 sigma^2) at order alpha;
    epsilon = min over alpha of RDP + log((alpha - 1) / alpha) - (log delta + log alpha) / (alpha - 1)
    (Canonne, Kamath, Steinke 2020, the conversion dp-accounting uses), on a fine grid of orders."""
    alpha = np.linspace(1.01, 400.0, 200_000)
    rdp = releases * alpha / (2 * sigma**2)
    return float(
        np.min(rdp + np.log1p(-1 / alpha) - (math.log(delta) + np.log(alpha)) / (alpha - 1))
    )


def exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """The tight epsilon of one Gaussian release of sensitivity 1 (Balle & Wang 2018):
    delta(eps) = Phi(1 / (2 sigma) - eps sigma) - e^eps Phi(-1 / (2 sigma) - eps sigma)."""

    def excess(eps):
        return (
            norm.cdf(0.5 / sigma - eps * sigma)
            - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma)
            - delta
        )

    return brentq(excess, 0.0, 100.0)


@pytest.mark.parametrize("sigma,releases", [(1.0, 1), (1.0, 3), (0.7, 10), (4.0, 100)])
def test_epsilon_is_the_gaussian_mechanisms_rdp_bound_at_half_the_noise(sigma, releases):
    """Replace-one: one client moves the sum by 2 C, so the releases are Gaussian mechanisms at
    sigma / 2. The accountant's orders are a grid: its epsilon sits at or just above the fine grid's."""
    hand = gaussian_rdp_epsilon(sigma / 2, DELTA, releases)
    assert hand <= release_epsilon(sigma, DELTA, releases).rdp <= hand * 1.01


def test_one_release_is_an_upper_bound_close_to_the_tight_one():
    """sigma = 1, delta = 1e-5, replace-one (sigma / 2 at sensitivity 1): RDP gives 10.73, PLD
    10.00, the exact Gaussian curve 9.99: PLD is the tight value from above."""
    exact, spent = exact_gaussian_epsilon(0.5, DELTA), release_epsilon(1.0, DELTA, 1)
    assert spent.rdp == pytest.approx(10.73, abs=0.01) and exact == pytest.approx(9.99, abs=0.01)
    assert exact <= spent.pld < 1.002 * exact < spent.rdp < 1.1 * exact
    assert spent.reported == spent.pld


@pytest.mark.parametrize("sigma,releases", [(0.5, 1), (1.0, 4), (2.0, 10), (8.0, 1)])
def test_replace_one_is_dp_accountings_own_relation(sigma, releases):
    """dp-accounting's PLD under its REPLACE_ONE relation puts the two neighbours' means 2
    sensitivities apart: the same bound as fedsim's sigma / 2 under add-or-remove. (Its RDP
    accountant's REPLACE_ONE keeps a Gaussian's distance at 1, which is why fedsim folds the
    relation into the multiplier instead of naming it.)"""
    library = pld.PLDAccountant(
        dp_accounting.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-3
    )
    library.compose(
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), releases)
    )
    assert release_epsilon(sigma, DELTA, releases).pld == pytest.approx(
        library.get_epsilon(DELTA), rel=2e-3
    )


def test_non_negative_rows_are_sqrt_2_clip_norms_apart():
    """The attack: a client replaces its row by the one farthest from it. Signed rows of norm C
    can sit 2 C apart (x and -x); rows of the simplex (negative entries set to 0 before clipping,
    whatever the client sent) at most sqrt 2 C: the sensitivity DPMean accounts under simplex."""
    rng = np.random.default_rng(7)
    rows = rng.normal(size=(2000, 2, 5))
    signed = [
        np.linalg.norm(clipped_sum(r[:1], 1.0, False) - clipped_sum(-r[:1], 1.0, False))
        for r in rows
    ]
    simplex = [
        np.linalg.norm(clipped_sum(r[:1], 1.0, True) - clipped_sum(r[1:], 1.0, True)) for r in rows
    ]
    assert max(signed) == pytest.approx(2.0) and max(simplex) <= NON_NEGATIVE + 1e-12
    assert max(simplex) > 0.95 * NON_NEGATIVE  # two rows on different coordinates come close


@pytest.mark.parametrize("sensitivity", [2.0, NON_NEGATIVE])
def test_pld_is_never_above_rdp(sensitivity):
    """Both are upper bounds; PLD (pessimistic, discretized at a share of the RDP epsilon) is the
    tighter on every sigma and count of releases tried, from epsilon 0.005 to 2,000."""
    for sigma in (0.1, 0.3, 0.5, 1.0, 2.0, 4.0, 8.0, 32.0, 100.0):
        for releases in (1, 2, 4, 10, 100):
            spent = release_epsilon(sigma, DELTA, releases, sensitivity)
            assert 0 < spent.pld <= spent.rdp, (sigma, releases, spent)


def sampled_steps(sigma: float, rate: float, steps: int = 1) -> dp_accounting.DpEvent:
    """DP-SGD's steps: Poisson-sampled Gaussians (noise sigma C, each record's gradient clipped to C)."""
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps
    )


def mixture(sigma: float, rate: float, shift: float):
    """The log density of one sampled step's noised sum along one record's gradient (in C): the
    record in with probability ``rate`` (at ``shift``; at rate 0, no record), N(0, sigma^2) noise."""
    if rate == 0:
        return lambda x: norm.logpdf(x, 0.0, sigma)
    return lambda x: np.logaddexp(
        math.log1p(-rate) + norm.logpdf(x, 0.0, sigma),
        math.log(rate) + norm.logpdf(x, shift, sigma),
    )


def renyi_by_quadrature(upper, lower, alpha: float) -> float:
    """D_alpha(upper || lower) of two log densities on the line, by scipy's quad."""
    integral, _ = quad(
        lambda x: math.exp(alpha * upper(x) + (1 - alpha) * lower(x)), -40.0, 40.0, limit=400
    )
    return math.log(integral) / (alpha - 1)


CASES = [(1.0, 0.01), (0.8, 0.1), (1.0, 0.5), (2.0, 0.5)]  # (sigma, rate)


@pytest.mark.parametrize("sigma,rate", CASES)
def test_adding_a_record_moves_a_sampled_step_no_more_than_removing_it(sigma, rate):
    """dp-accounting's add-or-remove RDP of a sampled Gaussian is the removing direction's,
    D(record in || record out); the replace-one bound also uses the adding one, D(out || in),
    which must be no larger (Mironov, Talwar & Zhang 2019 prove it; here by quadrature)."""
    orders = [2.0, 4.0, 8.0, 16.0]
    removing = dp_accounting.rdp.RdpAccountant(orders).compose(sampled_steps(sigma, rate)).rdp
    for alpha, bound in zip(orders, removing):
        out_in = renyi_by_quadrature(mixture(sigma, 0.0, 0.0), mixture(sigma, rate, 1.0), alpha)
        in_out = renyi_by_quadrature(mixture(sigma, rate, 1.0), mixture(sigma, 0.0, 0.0), alpha)
        assert in_out == pytest.approx(bound, rel=1e-6) and out_in <= bound, (alpha, out_in, bound)


@pytest.mark.parametrize("sigma,rate", CASES)
def test_the_replace_one_rdp_bounds_a_replaced_records_divergence(sigma, rate):
    """The attack the bound must hold against: a record whose clipped gradient is C e replaced by
    one at -C e (2 C apart, the farthest two records can be), the record count unchanged. Its
    Renyi divergence, by quadrature, is below the bound at every order tried, and the bound is
    above the add-or-remove curve."""
    orders = [1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0]
    bound = dict(zip(REPLACE_ONE_ORDERS, replace_one_rdp(sampled_steps(sigma, rate))))
    for alpha in orders:
        replaced = renyi_by_quadrature(mixture(sigma, rate, -1.0), mixture(sigma, rate, 1.0), alpha)
        removed = renyi_by_quadrature(mixture(sigma, rate, 1.0), mixture(sigma, 0.0, 0.0), alpha)
        assert removed <= replaced <= bound[alpha], (alpha, removed, replaced, bound[alpha])


@pytest.mark.parametrize("sigma,steps", [(1.0, 1), (1.0, 10), (4.0, 3)])
def test_replace_one_rdp_without_sampling_is_near_the_gaussians_at_half_the_noise(sigma, steps):
    """At rate 1 a replaced record moves every step's sum by 2 C: Gaussian mechanisms at sigma / 2,
    whose RDP is known by hand. The bound (remove, then add) is above it, and within 15%: its
    factor 1 + 1 / (4 alpha (alpha - 1)) is 4/3 at its smallest order, 1.5, where a large epsilon's
    best order lies (10 steps at sigma 1: 55.1 against 48.8)."""
    hand = gaussian_rdp_epsilon(sigma / 2, DELTA, steps)
    assert hand <= replace_one_account(sampled_steps(sigma, 1.0, steps), DELTA).rdp <= 1.15 * hand


@pytest.mark.parametrize("rate", [0.001, 0.01, 0.1, 0.5])
def test_pld_is_never_above_rdp_for_records_replaced(rate):
    """DP-SGD's steps, a record replaced (dp-accounting's PLD under REPLACE_ONE, the RDP bound from
    the add-or-remove curve): PLD is the tighter on every rate, sigma and count of steps tried,
    and both are at least the add-or-remove epsilons of the same steps."""
    for sigma in (0.5, 1.0, 4.0):
        for steps in (1, 30, 1000):
            event = sampled_steps(sigma, rate, steps)
            spent, removed = replace_one_account(event, DELTA), account(event, DELTA)
            assert 0 < spent.pld <= spent.rdp, (sigma, steps, spent)
            assert removed.rdp <= spent.rdp and removed.pld <= spent.pld * (1 + 1e-3), (
                sigma,
                steps,
                spent,
                removed,
            )


def test_epsilon_grows_with_rounds_and_falls_with_the_noise():
    by_round = [release_epsilon(1.0, DELTA, t).reported for t in range(1, 6)]
    assert all(a < b for a, b in zip(by_round, by_round[1:]))
    by_sigma = [release_epsilon(s, DELTA, 3).reported for s in (0.5, 1.0, 2.0, 8.0)]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))
    assert release_epsilon(1.0, 1e-3, 3).reported < release_epsilon(1.0, DELTA, 3).reported
    assert (
        release_epsilon(1.0, DELTA, 3, NON_NEGATIVE).reported
        < release_epsilon(1.0, DELTA, 3).reported
    )
    assert (
        release_epsilon(0.0, DELTA, 3).reported == math.inf
        and release_epsilon(1.0, DELTA, 0).reported == 0.0
    )


@pytest.mark.parametrize("sigma,count_std", [(1.0, 1.0), (0.8, 0.5), (2.0, 5.0)])
def test_adaptive_multiplier_is_the_one_flower_solved_for(sigma, count_std):
    """Flower derives the update's sigma from the configured one (Andrew et al. 2021);
    update and count together come back to the configured sigma, above the update's alone."""
    count, update = compute_adaptive_noise_params(sigma, 10, count_std)
    assert adaptive_noise_multiplier(update, count) == pytest.approx(sigma)
    assert update > sigma
    assert adaptive_noise_multiplier(0.0, count_std) == 0.0  # an unnoised update: no guarantee


def test_the_account_reports_each_phase_and_the_run():
    """Both accountants beside the reported (smaller) epsilon, per phase and for the run: four
    rounds at sigma 1 are 25.93 by RDP and 24.38 by PLD (replace-one), not the add-or-remove 10.73."""
    spent = CentralDP(DELTA, "DifferentialPrivacyServerSideFixedClipping", 1.0)
    for phase in ("fedavg", "fedavg", "fedavg", "fedprox"):
        spent.record(phase)
    report = spent.report()
    assert report["phases"]["fedavg"]["rounds"] == 3 and report["rounds"] == 4
    assert report["phases"]["fedavg"]["epsilon_by_round"] == [
        release_epsilon(1.0, DELTA, t).pld for t in (1, 2, 3)
    ]
    assert (
        report["phases"]["fedprox"]["epsilon"]
        == report["epsilon_per_round"]
        == release_epsilon(1.0, DELTA, 1).pld
    )
    assert (report["epsilon_rdp"], report["epsilon_pld"]) == pytest.approx((25.93, 24.38), abs=0.01)
    assert report["epsilon"] == report["epsilon_pld"] < report["epsilon_rdp"]
    assert (
        "Poisson sampling" in report["amplification_by_sampling"]
        and "not against the server" in report["covers"]
    )
    assert (
        "replace-one" in report["accountant"] and "whether a client took part" in report["covers"]
    )


DP = [
    "experiment=fede4rag_paper",
    "strategy=fedprox",
    "privacy=dp_server_fixed",
    "protocol.methods.fede4rag=null",
]


@pytest.mark.parametrize(
    "override,why",
    [
        ("privacy.delta=0.0", "privacy.delta must be in"),
        ("privacy.delta=1.0", "privacy.delta must be in"),
        ("privacy.delta=null", "privacy.delta must be in"),
        ("privacy.wrapper.noise_multiplier=0.0", "noise_multiplier must be > 0"),
        ("privacy.wrapper.noise_multiplier=-1.0", "noise_multiplier must be > 0"),
    ],
)
def test_a_meaningless_guarantee_is_refused_before_the_run(override, why):
    """Where ``fedsim run`` and the ServerApp check a config (``fedsim.config.schema.check``)."""
    check(compose(DP))
    with pytest.raises(ValueError, match=why):
        check(compose([*DP, override]))


def test_delta_is_not_asked_of_a_run_without_dp():
    check(compose(["experiment=fede4rag_paper", "privacy=none"]))
