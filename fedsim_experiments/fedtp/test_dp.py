"""FedTP's DP release against whoever reads the results: the sweep's points share no noise, a
run whose bound cannot hold is refused, reproducible (public) noise is refused for a remote deployment."""

import numpy as np
import pytest
from flwr.app import ConfigRecord

from fedsim.config.compose import compose
from fedsim.config.schema import check
from fedsim.privacy.dp import NoiseSource, clip_rows
from fedsim.privacy.plan import PrivacyPlan
from fedsim_experiments.common import build_strategy
from fedsim_experiments.fedtp.protocol import check_records, sweep_priors
from fedsim_strategies.dp_mean import DPMean


def _received(rows: np.ndarray) -> DPMean:
    strategy = DPMean(noise_multiplier=1.0, simplex=False, noise=NoiseSource.fresh())
    strategy.received = rows
    return strategy


def test_two_sweep_points_do_not_give_the_exact_mean():
    """The attack: were one standard normal draw z per seed reused by every sigma,
    (s2 * r1 - s1 * r2) / (s2 - s1) would give the exact mean from two published releases."""
    rows = np.random.default_rng(3).random((30, 5)) / 3
    exact = clip_rows(rows, 1.0).mean(axis=0)
    sweep = sweep_priors(_received(rows), [1.0, 4.0], seeds=2)
    (s1, r1), (s2, r2) = sweep["dp/1.0/0"], sweep["dp/4.0/0"]
    attack = (s2 * r1 - s1 * r2) / (s2 - s1)
    assert np.abs(attack - exact).max() > 1e-3
    noise = [released - exact for _, released in sweep.values()]
    for i in range(len(noise)):  # every point's noise is its own (not a scaled copy of another's)
        for j in range(i + 1, len(noise)):
            ratio = noise[i] / noise[j]
            assert not np.allclose(ratio, ratio[0])


def test_the_sweep_is_redrawn_identically_from_the_same_source():
    """A resumed run (the same run secret) re-releases the same points: no second release."""
    rows = np.random.default_rng(3).random((30, 5))
    a = _received(rows)
    b = DPMean(noise_multiplier=1.0, simplex=False, noise=a.noise)
    b.received = rows
    for (_, x), (_, y) in zip(
        sweep_priors(a, [1.0], 2).values(), sweep_priors(b, [1.0], 2).values()
    ):
        np.testing.assert_array_equal(x, y)


def test_the_slots_dp_mean_draws_from_the_runs_plan_and_no_other_source():
    """The slot's DPMean takes the run's noise source (and an audit's canaries) at construction:
    the plan's own object, not a copy of it nor a fresh source."""
    cfg = compose(["experiment=fedtp", "privacy.audit.enabled=true", "privacy.audit.canaries=3"])
    plan = PrivacyPlan.fresh(cfg)
    strategy = build_strategy(cfg, plan, 4)
    assert strategy.noise is plan.noise and strategy.audit_canaries == 3


def _hosted(rows_per_node: list[list[int]]) -> dict:
    return {
        n + 1: ConfigRecord({"rows": rows, "splits": ["valid_freq"] * len(rows)})
        for n, rows in enumerate(rows_per_node)
    }


def test_a_conversation_on_several_clients_is_refused():
    with pytest.raises(ValueError, match="reach several clients"):
        check_records(_hosted([[0], [1], [0]]), ["valid_freq"], DPMean(noise_multiplier=1.0))
    check_records(_hosted([[0], [1], [0]]), ["valid_freq"], DPMean(noise_multiplier=0.0))  # no DP


def test_several_conversations_per_client_are_refused_under_sampling():
    hosted = _hosted([[0, 1], [2, 3]])
    check_records(
        hosted, ["valid_freq"], DPMean(noise_multiplier=1.0)
    )  # every client: rows clipped
    with pytest.raises(ValueError, match="at most 1 allowed"):
        check_records(hosted, ["valid_freq"], DPMean(noise_multiplier=1.0, fraction_train=0.5))


def test_reproducible_noise_is_refused_for_a_remote_deployment():
    """Public noise on a remote SuperLink is refused; on this machine (deploy_local, whose
    processes are the user's own, as a simulation's) it is what the parity test compares."""
    deploy = ["hardware=deploy_remote", "hardware.superlink=127.0.0.1:9", "hardware.insecure=true"]
    check(compose(deploy))
    with pytest.raises(ValueError, match="reproducible_noise"):
        check(compose([*deploy, "privacy.reproducible_noise=true"]))
    check(compose(["hardware=deploy_local", "privacy.reproducible_noise=true"]))
