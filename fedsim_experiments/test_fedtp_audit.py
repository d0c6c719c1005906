"""FedTP's DP release audited: canary clients in the prior and in each sigma's sweep release, a
measured lower bound on epsilon beside the accountant's. A broken mechanism (no noise, noise
from the public seed) is caught, the working one is not; an audit the run cannot do is refused
before it starts."""

from functools import cache

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedsim.privacy import dp as privacy
from fedsim.privacy.audit import PrivacyAuditFailed
from fedsim.privacy.dp import NoiseSource
from fedsim.run.config import compose
from fedsim.run.data import resolve_data_root
from fedsim.run.schema import check
from fedsim_experiments.fedtp import audit_releases
from fedsim_strategies.conftest import NodeIds, _run_identity  # noqa: F401 (fixture: messages outside a run)
from fedsim_strategies.dp_mean import DPMean
from fedsim_tasks.topical_chat.dataset import load_conversations, load_topics, local_preference

AUDIT = ["privacy.audit.enabled=true", "strategy.noise_multiplier=4.0", "protocol.dp_sigmas=[1.0,4.0]"]


@cache
def prior_rows() -> np.ndarray:
    """p_c of 60 real validation conversations (30 per split), as FedTP's prior clients send them."""
    root = str(resolve_data_root(None))
    topics = len(load_topics(root))
    return np.stack([local_preference(c, topics)
                     for c in load_conversations(root, ("valid_freq", "valid_rare"), 30)])


def audited(noise: NoiseSource):
    """One audit run's prior release (sigma 4, every client, one round) and its audit."""
    cfg = compose(AUDIT)
    rows = prior_rows()
    strategy = DPMean(noise_multiplier=4.0, noise=noise)
    strategy.audit_canaries = int(cfg.privacy.audit.canaries)
    uniform = np.full(rows.shape[1], 1.0 / rows.shape[1])
    strategy.configure_train(1, ArrayRecord({"vectors": Array(uniform)}), ConfigRecord(), NodeIds(len(rows)))
    reply = Message(RecordDict({"arrays": ArrayRecord({"vectors": Array(rows)}),
                                "metrics": MetricRecord({"num-examples": len(rows)})}),
                    dst_node_id=1, message_type=MessageType.TRAIN)
    arrays, _ = strategy.aggregate_train(1, [reply])
    return audit_releases(cfg, strategy, arrays["vectors"].numpy())


def by_release(report) -> dict:
    return {b.release: b for b in report.bounds}


def test_the_working_mechanism_holds_at_every_sigma():
    report = audited(NoiseSource(2024))  # the run's secret noise (a fixed one: the test is deterministic)
    bounds = by_release(report)
    assert set(bounds) == {"prior", "dp/1.0/0", "dp/4.0/0"}
    assert all(b.canaries == 256 and b.confidence == 0.95 for b in report.bounds)
    assert all(0 <= b.epsilon_lower < b.epsilon_upper for b in report.bounds)
    assert bounds["dp/4.0/0"].epsilon_upper == pytest.approx(1.0126, abs=1e-3)  # RDP, below the one-shot 1.21
    report.enforce()


def test_a_release_without_noise_is_caught(monkeypatch):
    """The mechanism is broken: it reports sigma's epsilon and adds no noise. At sigma 4 the
    accountant says 1.01; the release shows every canary."""
    monkeypatch.setattr(privacy, "gaussian_noise", lambda rng, std, size: np.zeros(size))
    bounds = by_release(audited(NoiseSource(2024)))
    for name in ("prior", "dp/4.0/0"):
        assert bounds[name].epsilon_lower > 2.5 > 2 * bounds[name].epsilon_upper
    assert bounds["dp/1.0/0"].holds  # 256 canaries cannot show more than about 4 (the accountant says 4.73)
    with pytest.raises(PrivacyAuditFailed, match="prior .*dp/4.0/0"):
        audited(NoiseSource(2024)).enforce()


def test_noise_from_the_public_seed_is_caught():
    """The mechanism is broken: its noise comes from the public seed (privacy.reproducible_noise,
    or the bug issue 36 fixed). The attacker regenerates it and subtracts it."""
    bounds = by_release(audited(NoiseSource.public(0)))
    for name in ("prior", "dp/4.0/0"):
        assert bounds[name].epsilon_lower > 2.5 > 2 * bounds[name].epsilon_upper
        assert bounds[name].attack == "release minus the public seed's noise"


@pytest.mark.parametrize("overrides, why", [
    (["experiment=fedtp_aggregate"], "puts no canaries"),
    (["strategy=fedavg"], "strategy=dp_mean"),
    (["num_rounds=2"], "num_rounds=1"),
    (["strategy.fraction_train=0.5"], "fraction_train=1"),
    (["privacy.audit.canaries=300"], "half the prior's 516 topics"),
    (["privacy.audit.canaries=1"], "canaries must be >= 2"),
    (["privacy.audit.confidence=1.0"], "confidence must be in"),
    (["privacy.audit.guess_shares=[0.5,1.5]"], "guess_shares must be"),
])
def test_an_audit_the_run_cannot_do_is_refused_before_it_starts(overrides, why):
    with pytest.raises(ValueError, match=why):
        check(compose(["privacy.audit.enabled=true", *overrides]))


def test_fedtps_own_audit_is_accepted():
    check(compose(["privacy.audit.enabled=true"]))
