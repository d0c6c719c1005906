"""The epsilon fedsim reports for Flower's DP wrappers (no amplification by sampling), checked
against computations that share no code with the accountant, and the refusals of a DP config
whose (epsilon, delta) would mean nothing."""

import math

import numpy as np
import pytest
from flwr.supercore.differential_privacy import compute_adaptive_noise_params
from scipy.optimize import brentq
from scipy.stats import norm

from fedsim.privacy.dp import CentralDP, adaptive_noise_multiplier, rdp_epsilon, unamplified_epsilon
from fedsim.run.config import compose
from fedsim.run.schema import check

DELTA = 1e-5


def gaussian_rdp_epsilon(sigma: float, delta: float, releases: int) -> float:
    """By hand: ``releases`` Gaussian mechanisms have RDP T alpha / (2 sigma^2) at order alpha;
    epsilon = min over alpha of RDP + log((alpha - 1) / alpha) - (log delta + log alpha) / (alpha - 1)
    (Canonne, Kamath, Steinke 2020, the conversion dp-accounting uses), on a fine grid of orders."""
    alpha = np.linspace(1.01, 400.0, 200_000)
    rdp = releases * alpha / (2 * sigma**2)
    return float(np.min(rdp + np.log1p(-1 / alpha) - (math.log(delta) + np.log(alpha)) / (alpha - 1)))


def exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """The tight epsilon of one Gaussian release of sensitivity 1 (Balle & Wang 2018):
    delta(eps) = Phi(1 / (2 sigma) - eps sigma) - e^eps Phi(-1 / (2 sigma) - eps sigma)."""
    def excess(eps):
        return norm.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma) - delta
    return brentq(excess, 0.0, 100.0)


@pytest.mark.parametrize("sigma,releases", [(1.0, 1), (1.0, 3), (0.7, 10), (4.0, 100)])
def test_epsilon_is_the_gaussian_mechanisms_rdp_bound(sigma, releases):
    """The accountant's orders are a grid: its epsilon sits at or just above the fine grid's."""
    hand = gaussian_rdp_epsilon(sigma, DELTA, releases)
    assert hand <= unamplified_epsilon(sigma, DELTA, releases) <= hand * 1.01


def test_one_release_is_an_upper_bound_close_to_the_tight_one():
    """sigma = 1, delta = 1e-5: RDP gives 4.73, the exact Gaussian curve 4.38 (and the classic
    sqrt(2 ln(1.25 / delta)) / sigma = 4.84)."""
    exact, rdp = exact_gaussian_epsilon(1.0, DELTA), unamplified_epsilon(1.0, DELTA, 1)
    assert exact == pytest.approx(4.38, abs=0.01) and rdp == pytest.approx(4.73, abs=0.01)
    assert exact < rdp < 1.1 * exact


def test_epsilon_grows_with_rounds_and_falls_with_the_noise():
    by_round = [unamplified_epsilon(1.0, DELTA, t) for t in range(1, 6)]
    assert all(a < b for a, b in zip(by_round, by_round[1:]))
    by_sigma = [unamplified_epsilon(s, DELTA, 3) for s in (0.5, 1.0, 2.0, 8.0)]
    assert all(a > b for a, b in zip(by_sigma, by_sigma[1:]))
    assert unamplified_epsilon(1.0, 1e-3, 3) < unamplified_epsilon(1.0, DELTA, 3)
    assert unamplified_epsilon(0.0, DELTA, 3) == math.inf and unamplified_epsilon(1.0, DELTA, 0) == 0.0


def test_no_amplification_is_full_participation():
    """Without amplification the sample does not enter: the Poisson bound at rate 1."""
    assert unamplified_epsilon(1.0, DELTA, 4) == pytest.approx(rdp_epsilon(1.0, DELTA, 4, 7, 7))
    assert unamplified_epsilon(1.0, DELTA, 4) > rdp_epsilon(1.0, DELTA, 4, 2, 7)


@pytest.mark.parametrize("sigma,count_std", [(1.0, 1.0), (0.8, 0.5), (2.0, 5.0)])
def test_adaptive_multiplier_is_the_one_flower_solved_for(sigma, count_std):
    """Flower derives the update's sigma from the configured one (Andrew et al. 2021);
    update and count together come back to the configured sigma, above the update's alone."""
    count, update = compute_adaptive_noise_params(sigma, 10, count_std)
    assert adaptive_noise_multiplier(update, count) == pytest.approx(sigma)
    assert update > sigma
    assert adaptive_noise_multiplier(0.0, count_std) == 0.0  # an unnoised update: no guarantee


def test_the_account_reports_each_phase_and_the_run():
    spent = CentralDP(DELTA, "DifferentialPrivacyServerSideFixedClipping", 1.0)
    for phase in ("fedavg", "fedavg", "fedavg", "fedprox"):
        spent.record(phase)
    report = spent.report()
    assert report["phases"]["fedavg"]["rounds"] == 3 and report["rounds"] == 4
    assert report["phases"]["fedavg"]["epsilon_by_round"] == [unamplified_epsilon(1.0, DELTA, t) for t in (1, 2, 3)]
    assert report["phases"]["fedprox"]["epsilon"] == report["epsilon_per_round"] == unamplified_epsilon(1.0, DELTA, 1)
    assert report["epsilon"] == unamplified_epsilon(1.0, DELTA, 4)
    assert "Poisson sampling" in report["amplification_by_sampling"] and "not against the server" in report["covers"]


DP = ["experiment=fede4rag_paper", "strategy=fedprox", "privacy=dp_server_fixed", "protocol.methods.fede4rag=null"]


@pytest.mark.parametrize("override,why", [
    ("privacy.delta=0.0", "privacy.delta must be in"), ("privacy.delta=1.0", "privacy.delta must be in"),
    ("privacy.delta=null", "privacy.delta must be in"),
    ("privacy.wrapper.noise_multiplier=0.0", "noise_multiplier must be > 0"),
    ("privacy.wrapper.noise_multiplier=-1.0", "noise_multiplier must be > 0")])
def test_a_meaningless_guarantee_is_refused_before_the_run(override, why):
    """Where ``fedsim run`` and the ServerApp check a config (``fedsim.run.schema.check``)."""
    check(compose(DP))
    with pytest.raises(ValueError, match=why):
        check(compose([*DP, override]))


def test_delta_is_not_asked_of_a_run_without_dp():
    check(compose(["experiment=fede4rag_paper", "privacy=none"]))
