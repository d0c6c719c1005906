"""Distributed DP under SecAgg+ (``ddp.py``), attacks first: what the server, a colluding set
below t and a client short of noise can do; the sum's noise has the stated variance (statistical
tests with fixed seeds, each with a control that must fail); the Skellam accountant against the
exact Renyi divergence; the clients' own checks at the protocol's consistency step."""

import math

import numpy as np
import pytest
from dp_accounting import rdp
from scipy.stats import skellam

from fedsim.privacy.audit import noise_check
from fedsim.privacy.dp import release_epsilon
from fedsim.privacy.secagg import ddp
from fedsim.privacy.secagg import protocol as p
from fedsim.privacy.secagg.test_protocol import Federation

DIM, B = 4000, 2**12


def secure_sum(inputs: list[np.ndarray]) -> tuple[int, np.ndarray]:
    """What the server unmasks: the inputs' sum mod 2^32 (SecAgg+'s masks cancel in it)."""
    total = np.zeros_like(inputs[0])
    for vector in inputs:
        total = total + vector
    return ddp.decode_sum(total)


def rows_and_inputs(n, plan, seed, shortfall=None):
    """``n`` clients' simplex rows, their exact integer sum (rounded without noise by the same
    coins), and their inputs; client 0 adds ``shortfall`` x its noise share."""
    rng = np.random.default_rng(seed)
    rows = rng.dirichlet(np.ones(DIM), size=n)
    inputs, exact = [], np.zeros(DIM, np.int64)
    for i, row in enumerate(rows):
        state = rng.bit_generator.state
        integers = ddp.integer_row(row, 1.0, plan.bound, True, rng)
        exact += integers
        rng.bit_generator.state = state  # the same rounding coins, then its noise
        share = plan if i or shortfall is None else _scaled(plan, shortfall)
        inputs.append(ddp.encode_rows(row[None, :], 1.0, True, share, rng))
    return rows, exact, inputs


def _scaled(plan, factor):
    """A plan whose share variance is ``factor`` x ``plan``'s (a client that noises less)."""
    ratio = factor / (plan.min_live - plan.colluders)
    return ddp.NoisePlan(plan.noise_multiplier * math.sqrt(ratio), plan.bound, 1)


def test_the_sum_carries_the_stated_noise_and_a_shortfall_is_caught():
    """20 clients, min_live 20: the unmasked sum minus the exact integer sum is the noise; in
    units of B its size is sigma (chi-square at 1%, 4000 coordinates). Control: the clients
    adding a quarter of their share each (noise std sigma / 2) fails the same test."""
    plan = ddp.NoisePlan(1.5, B, min_live=20)
    _, exact, inputs = rows_and_inputs(20, plan, seed=0)
    count, noised = secure_sum(inputs)
    assert count == 20
    check = noise_check("ddp", 1.5, (noised - exact) / B, 0.01)
    assert check.holds and abs(check.measured / 1.5 - 1) < 0.05
    low = ddp.NoisePlan(1.5 / 2, B, min_live=20)
    _, exact, inputs = rows_and_inputs(20, low, seed=0)
    assert not noise_check("ddp", 1.5, (secure_sum(inputs)[1] - exact) / B, 0.01).holds


def test_a_colluding_set_below_t_removes_only_its_own_noise():
    """Server plus 4 colluders of 12 (t = 7): they know their rows and their noise shares and
    subtract them; what is left is the 8 honest shares, sized by colluders=4 to sigma. With the
    noise sized for no colluders (colluders=0) the same coalition is left with 8/12 of the
    variance: the shortfall the ``colluders`` setting exists for."""
    for colluders, expected in ((4, 1.0), (0, math.sqrt(8 / 12))):
        plan = ddp.NoisePlan(1.0, B, min_live=12, colluders=colluders)
        rng = np.random.default_rng(1)
        rows = rng.dirichlet(np.ones(DIM), size=12)
        integers = [ddp.integer_row(r, 1.0, B, True, rng) for r in rows]
        noises = [ddp.skellam(plan.share_variance, DIM, rng) for _ in rows]
        inputs = [
            np.concatenate([[1], y + z]).astype(np.int64).astype(np.uint32)
            for y, z in zip(integers, noises)
        ]
        _, noised = secure_sum(inputs)
        # the coalition subtracts its 4 members' rows and noise, and knows the honest rows too
        # (the strongest attacker of DP): only the honest noise is left
        residual = (noised - sum(integers) - sum(noises[:4])) / B
        assert np.sqrt(np.mean(residual**2)) == pytest.approx(expected, rel=0.05)


def test_a_client_short_of_noise_is_covered_by_the_colluders_setting():
    """One client of 10 adds no noise (it reports nothing of its noise: the server cannot tell).
    Sized for colluders=1, the other 9 shares still carry sigma (chi-square holds)."""
    plan = ddp.NoisePlan(1.0, B, min_live=10, colluders=1)
    _, exact, inputs = rows_and_inputs(10, plan, seed=2, shortfall=1e-12)
    assert noise_check("ddp", 1.0, (secure_sum(inputs)[1] - exact) / B, 0.01).holds


def test_a_replayed_mask_request_gets_no_second_noised_input():
    """Averaging k noised copies of one input divides its noise by sqrt k: a second mask request
    in a round is refused, and a round is never restarted (replayed keys refused)."""
    fed = Federation()
    with pytest.raises(p.Refused, match="at stage 'mask', not 'share'"):
        p.mask(fed.states[1], 1, {}, fed.vectors[1])
    with pytest.raises(p.Refused, match="replayed or stale"):
        p.advertise(fed.states[1].round, 1, 1)


def test_clients_refuse_a_live_set_below_min_live_or_padded_with_a_ghost():
    """The server claims two live clients dropped (to sum fewer shares of noise): every client
    sized for 5 refuses the set of 3. A set padded to 5 with a node that never sent this client
    shares (a ghost carrying no noise) is refused too."""
    fed = Federation()
    for state in fed.states.values():
        state.min_live = 5
    with pytest.raises(p.Refused, match="sized for at least 5"):
        p.check(fed.states[1], 1, [1, 2, 3])
    del fed.states[2].seed_shares["5"]  # node 5's shares never reached node 2
    with pytest.raises(p.Refused, match="sent this node no shares"):
        p.check(fed.states[2], 1, [1, 2, 3, 4, 5])
    assert p.check(fed.states[1], 1, [1, 2, 3, 4, 5])  # the honest set is signed


def test_integer_rows_keep_the_stated_bound_and_sensitivity():
    """Every integer row has norm <= B and no negative entry on the simplex, whatever the
    rounding coins; two rows differ by at most sqrt 2 B (the accountant's L2)."""
    rng = np.random.default_rng(3)
    l2, _ = ddp.sensitivities(64, 30, True)
    for _ in range(300):
        a, b = rng.dirichlet(np.full(30, 0.1), size=2) * rng.uniform(0.5, 3)
        ya, yb = (ddp.integer_row(r, 1.0, 64, True, rng) for r in (a, b))
        assert np.linalg.norm(ya) <= 64 and (ya >= 0).all()
        assert np.linalg.norm(ya - yb) <= l2 + 1e-9


@pytest.mark.parametrize(
    "variance, shift, slack", [(50.0, 3, 1.5), (400.0, 10, 1.25), (2500.0, 40, 1.25)]
)
def test_skellam_rdp_bound_holds_against_the_exact_divergence(variance, shift, slack):
    """Theorem 3.5's curve is above the exact Renyi divergence of Sk(mu) + shift against Sk(mu)
    (one coordinate, D1 = D2 = shift), and within ``slack`` of it at alpha 2-32 (a loose bound
    would pass the first check alone; the correction terms weigh most at small mu)."""
    support = np.arange(-int(variance) - 40 * int(math.sqrt(variance)) - shift, 60 * int(variance))
    log_q = skellam.logpmf(support, variance / 2, variance / 2)
    log_p = skellam.logpmf(support - shift, variance / 2, variance / 2)
    orders = np.arange(2, 33)
    bound = ddp.skellam_rdp(variance, float(shift), float(shift), orders)
    for alpha, upper in zip(orders, bound):
        terms = alpha * log_p + (1 - alpha) * log_q
        exact = float(np.logaddexp.reduce(terms[np.isfinite(terms)])) / (alpha - 1)
        assert exact <= upper * (1 + 1e-9)
        assert upper <= slack * exact


def test_skellam_epsilon_meets_the_gaussians_at_fine_quantization():
    """At B = 2^16 the Skellam release's epsilon is the Gaussian's at the same sigma and the same
    integer orders (alpha / sigma^2 for sensitivity sqrt 2 C), within 1e-4: the quantization
    costs no privacy; at B = 4 it costs some (the correction terms). dp-accounting's own grid,
    with fractional orders, is tighter at small sigma (docs/secure-aggregation.md)."""
    for sigma in (0.5, 1.0, 4.0):
        gaussian = rdp.compute_epsilon(ddp.ORDERS, ddp.ORDERS / sigma**2, 1e-5)[0]
        fine = ddp.skellam_epsilon(
            [(sigma * 2**16) ** 2], *ddp.sensitivities(2**16, 40, True), 1e-5
        )
        assert fine.reported == pytest.approx(gaussian, rel=1e-4)
        assert fine.reported >= release_epsilon(sigma, 1e-5, 1, math.sqrt(2)).rdp * (1 - 1e-9)
        coarse = ddp.skellam_epsilon([(sigma * 4) ** 2], *ddp.sensitivities(4, 40, True), 1e-5)
        assert coarse.reported > fine.reported * 1.001


def test_a_noise_plan_that_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="noise_multiplier > 0"):
        ddp.NoisePlan(0.0, B, 5)  # a server asking for no noise: the client refuses to encode
    with pytest.raises(ValueError, match="colluders"):
        ddp.NoisePlan(1.0, B, 5, colluders=5)
    with pytest.raises(ValueError, match="2\\^31"):
        ddp.NoisePlan(1.0, 2**24, 200).check_range(200)
