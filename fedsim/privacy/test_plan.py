"""The run's privacy plan: HE switched on in one place and composed from its one YAML, and an
audit's attacker who redraws a release's noise from the public seed through the plan."""

from dataclasses import replace

import numpy as np
import pytest
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim.privacy.dp import RELEASE, CentralDP, NoiseSource, Release, clipped_sum, gaussian_mean
from fedsim.privacy.plan import HE_ENTRY, CentralLedger, PrivacyPlan


def test_a_methods_he_is_the_one_yamls_entry_with_the_tasks_ckks_and_its_own_settings():
    cfg = compose(["experiment=fede4rag_paper"])
    plan = PrivacyPlan.fresh(cfg)
    ckks = {k: cfg.task.he[k] for k in ("poly_modulus_degree", "coeff_mod_bit_sizes")}
    assert not plan.he  # the slot runs in plaintext; a method may still ask HE for itself
    assert plan.he_wrapper(chunk_floats=4096, one_trip=False) == {
        **OmegaConf.to_container(OmegaConf.load(HE_ENTRY).wrapper),
        **ckks,
        "chunk_floats": 4096,
        "one_trip": False,
    }


def test_the_slot_under_he_takes_the_runs_own_entry():
    plan = PrivacyPlan.fresh(
        compose(
            ["experiment=fede4rag_paper", "privacy=he_fedavg", "privacy.wrapper.chunk_floats=1024"]
        )
    )
    assert plan.he and plan.he_wrapper()["chunk_floats"] == 1024


def test_a_task_without_ckks_parameters_cannot_switch_he_on():
    plan = PrivacyPlan.fresh(compose(["experiment=fedtp"]))
    assert not plan.he and plan.he_entry is None
    with pytest.raises(ValueError, match="CKKS"):
        plan.he_wrapper()


def _release(noise: NoiseSource, labels=(RELEASE, 1)) -> tuple[Release, np.ndarray]:
    """A release of 10 rows at sigma 2 from ``noise``'s stream ``labels``, and the exact sum it noised."""
    rows = np.random.default_rng(0).random((10, 6))
    release = replace(gaussian_mean(rows, 1.0, 2.0, noise.rng(*labels), False), labels=labels)
    return release, clipped_sum(rows, 1.0, False)


def test_the_public_seed_gives_the_attacker_the_noise_only_where_the_run_asked_for_it():
    """Under reproducible noise the plan's guess from the seed is the release's noise exactly; under
    the run's secret it is a draw of its own, as far from the noise as two independent ones."""
    public = PrivacyPlan(NoiseSource.public(7), 7)
    release, exact = _release(public.noise)
    np.testing.assert_allclose(public.seed_noise(release), release.noised * 10 - exact, atol=1e-12)
    private = PrivacyPlan(NoiseSource.from_key(bytes(32)), 7)
    release, exact = _release(private.noise)
    assert np.abs(private.seed_noise(release) - (release.noised * 10 - exact)).max() > 0.5


def test_a_second_dp_wrapper_at_another_sigma_cannot_spend_from_the_first_ones_account():
    """Shared silently, the 0.5 releases would be reported at sigma 4: far too small an epsilon."""
    ledger = CentralLedger()
    first = ledger.open(CentralDP(1e-5, "DifferentialPrivacyServerSideFixedClipping", 4.0))
    assert ledger.open(CentralDP(1e-5, "DifferentialPrivacyServerSideFixedClipping", 4.0)) is first
    with pytest.raises(ValueError, match="one run, one DP mechanism"):
        ledger.open(CentralDP(1e-5, "DifferentialPrivacyServerSideFixedClipping", 0.5))
