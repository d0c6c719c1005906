"""The one-run audit's lower bound: the paper's p-value, the guesses, the Bonferroni share of
every attack, the client-level canaries of a released mean, and the failed check; the noise
checks: each release's noise against its sigma, the releases' noise against each other."""

import numpy as np
import pytest

from fedsim.privacy.audit import (
    AuditReport,
    Bound,
    MeanCanaries,
    PrivacyAuditFailed,
    audit_release,
    epsilon_lower_bound,
    fair_coins,
    guesses_at,
    noise_check,
    p_value,
    sampled_gaussian_scores,
    shared_noise_check,
)
from fedsim.privacy.dp import clip_rows, gaussian_mean

SHARES = [0.1, 0.25, 0.5, 1.0]


@pytest.mark.parametrize(
    "canaries, guesses, correct, delta, expected",
    [
        (1000, 600, 600, 1e-5, 5.27040),
        (100, 100, 100, 1e-5, 3.49022),
        (500, 100, 90, 1e-5, 1.62849),
        (256, 256, 200, 1e-5, 1.01704),
        (200, 20, 20, 0.0, 1.82272),
        (1000, 1000, 500, 1e-5, 0.0),
    ],
)
def test_the_bound_is_the_papers(canaries, guesses, correct, delta, expected):
    """At 95%: the values jax_privacy 2.0.0's ``auditing._epsilon_one_run`` gives for the same
    counts (run once beside this code; the package itself needs jax)."""
    assert epsilon_lower_bound(canaries, guesses, correct, delta, 0.05) == pytest.approx(
        expected, abs=1e-4
    )


def test_the_p_value_grows_with_epsilon_and_is_the_significance_at_the_bound():
    eps = epsilon_lower_bound(300, 100, 85, 1e-5, 0.01)
    assert p_value(300, 100, 85, eps, 1e-5) == pytest.approx(0.01, rel=1e-3)
    assert p_value(300, 100, 85, eps / 2, 1e-5) < 0.01 < p_value(300, 100, 85, eps * 1.5, 1e-5)
    assert p_value(300, 100, 85, 1.0, 1e-5) > p_value(
        300, 100, 85, 1.0, 0.0
    )  # delta weakens the test


def test_guesses_take_the_top_as_in_and_the_bottom_as_out():
    included = np.array([True, False, True, False, True, False, False, True])
    scores = np.array([9.0, 1.0, 8.0, 2.0, 0.5, 3.0, 4.0, 7.0])  # canary 4 is in but scores low
    assert guesses_at(scores, included, 0.5) == (
        4,
        3,
    )  # "in": 0, 2 (right); "out": 4 (wrong), 1 (right)
    assert guesses_at(scores, included, 1.0) == (
        8,
        6,
    )  # "in": 0, 2, 7 and 6 (wrong); "out": 4 (wrong), 1, 3, 5


def test_trying_many_attacks_does_not_make_a_bound_out_of_chance():
    """Attack: score the canaries by 200 guesses unrelated to the coins and keep the best. Each
    alone is a valid test at 95%; the best of 200, untested, 'refutes' a small epsilon almost
    surely. With each tested at its Bonferroni share, chance gives no bound."""
    rng = np.random.default_rng(11)
    included = fair_coins(200, rng)
    attacks = {f"chance {i}": rng.random(200) for i in range(200)}
    lucky = max(
        epsilon_lower_bound(200, g, r, 1e-5, 0.05)
        for g, r in (guesses_at(s, included, share) for s in attacks.values() for share in SHARES)
    )
    assert lucky > 0.3
    assert (
        audit_release("chance", 1.0, attacks, included, 1.0, 1e-5, 0.05, 0.95, SHARES).epsilon_lower
        == 0.0
    )


def test_a_lower_bound_above_the_accountant_fails_the_run_naming_the_release():
    holds = Bound("a", 1.0, 4.7, 0.9, 1e-5, 0.95, 256, 64, 55, "release")
    broken = Bound("b", 4.0, 1.0, 3.9, 1e-5, 0.95, 256, 256, 256, "release")
    AuditReport([holds], "x").enforce()
    with pytest.raises(
        PrivacyAuditFailed, match=r"for b \(accountant 1.000, measured at least 3.900"
    ):
        AuditReport([holds, broken], "x").enforce()
    assert AuditReport([holds, broken], "x").as_dict()["holds"] is False


def test_mean_canaries_hold_the_least_weighted_coordinates_and_the_noiseless_release_shows_them():
    rng = np.random.default_rng(3)
    rows = rng.random((30, 40)) ** 4  # uneven weight per coordinate
    weight = clip_rows(rows, 1.0).sum(axis=0)
    canaries = MeanCanaries.place(weight, 20, 1.0, rng)
    assert set(canaries.coords) == set(np.argsort(weight)[:20])
    joined = np.vstack([rows, canaries.rows()])
    assert len(joined) == 30 + 20  # a canary out is the zero row: the count is the same either way
    np.testing.assert_allclose(
        canaries.rows().sum(axis=0)[canaries.coords], canaries.included * 1.0
    )
    for simplex in (True, False):
        released = gaussian_mean(joined, 1.0, 0.0, rng, simplex).mean
        scores = canaries.scores(released, simplex)
        assert scores[canaries.included].min() > scores[~canaries.included].max()
    with pytest.raises(ValueError, match=r"in \[2, 20\]"):
        MeanCanaries.place(weight, 21, 1.0, rng)


def test_known_batches_score_only_the_steps_that_sampled_the_canary():
    steps = np.array([[1.0, 0.2], [0.1, 0.9], [0.8, -0.3]])
    sampled = np.array([[True, False], [False, True], [True, False]])
    np.testing.assert_allclose(
        sampled_gaussian_scores(steps, 0.5, 2.0, sampled),
        [((1.0 - 0.5) + (0.8 - 0.5)) / 4, (0.9 - 0.5) / 4],
    )
    unknown = sampled_gaussian_scores(steps, 0.5, 2.0)
    assert unknown.shape == (2,) and np.all(np.isfinite(unknown))


def test_the_noise_check_has_the_size_and_the_power_it_states():
    """Over 1,000 releases of 516 coordinates at significance 0.01: the claimed noise fails about
    1% of them; a noise std 1.1x below the claim fails them at the power the check writes beside
    it, and 1.5x and 2x below, every one."""
    rng = np.random.default_rng(5)
    checks = {
        f: [noise_check("r", 4.0, rng.normal(0.0, 4.0 / f, 516), 0.01) for _ in range(1000)]
        for f in (1.0, 1.1, 1.5, 2.0)
    }
    caught = {f: np.mean([not c.holds for c in cs]) for f, cs in checks.items()}
    assert caught[1.0] == pytest.approx(0.01, abs=0.008)
    assert caught[1.1] == pytest.approx(checks[1.1][0].power_at(1.1), abs=0.05)
    assert caught[1.5] == caught[2.0] == 1.0 and checks[2.0][0].power_at(2.0) == pytest.approx(1.0)
    assert 1.1 < checks[1.0][0].shortfall_at_90 < 1.2 and checks[1.0][0].measured == pytest.approx(
        4.0, rel=0.1
    )


def test_releases_that_share_noise_or_cancel_it_together_are_caught():
    """The attack: two releases at sigma 1 and 4 drawing one standard normal z give the exact sum
    as (4 R1 - R4) / 3; three releases whose noise sums to 0 give it as their weighted sum. Each
    release's noise alone is what its sigma claims; together they are linearly dependent."""
    rng = np.random.default_rng(8)
    exact, z = rng.random(516), rng.standard_normal((12, 516))
    r1, r4 = exact + 1.0 * z[0], exact + 4.0 * z[0]
    np.testing.assert_allclose((4 * r1 - r4) / 3, exact)
    names = [f"r{i}" for i in range(12)]
    shared = z.copy()
    shared[5] = shared[0]
    cancelling = z.copy()
    cancelling[7] = -(z[2] + z[3]) / np.sqrt(2)  # r2 + r3 + sqrt 2 r7: no noise left
    for standardized in (shared, cancelling):
        assert all(noise_check(n, 1.0, r, 0.01).holds for n, r in zip(names, standardized))
        assert not shared_noise_check(names, standardized, 0.01).holds
    assert shared_noise_check(names, shared, 0.01).pair == ["r0", "r5"]
    slightly = z.copy()
    slightly[9] = 0.8 * z[9] + 0.6 * z[4]  # correlation 0.6: a partly reused draw
    assert not shared_noise_check(names, slightly, 0.01).holds
    silent = z.copy()
    silent[3] = 0.0  # a release without noise
    assert shared_noise_check(names, silent, 0.01).pair == ["r3", "r3"]
    assert not noise_check("r3", 1.0, silent[3], 0.01).holds


def test_independent_releases_pass_the_shared_noise_check_at_its_size():
    """Bartlett's chi-square is an approximation: over 1,000 runs of 26 independent releases of
    516 coordinates (FedTP's paper sweep), 5% fail at significance 0.05."""
    rng = np.random.default_rng(9)
    names = [f"r{i}" for i in range(26)]
    failed = np.mean(
        [
            not shared_noise_check(names, rng.standard_normal((26, 516)), 0.05).holds
            for _ in range(1000)
        ]
    )
    assert failed == pytest.approx(0.05, abs=0.02)
