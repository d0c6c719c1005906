"""DPMean as distributed DP under SecAgg+ through the messaging path, attacks first: the server's
view of a round is the noised sum only (no row, no noise-free sum), the clients refuse a live set
smaller than their noise is sized for (a server that drops clients to thin the noise gets no sum),
a client lying about its row count fails the round, and the release is DPMean's mean within the
noise it states. Clients are served as the ClientApp serves them, through the SecAgg layer."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from fedsim.config import node_local
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.privacy.secagg import ddp
from fedsim.privacy.secagg import messages as keys
from fedsim.runtime.client_app import SEED_KEY
from fedsim.runtime.client_state import RUN_KEY
from fedsim.runtime.inprocess_grid import InProcessGrid
from fedsim.runtime.messaging import Messenger, PhaseFailed
from fedsim.runtime.records import to_record
from fedsim.runtime.secagg_layer import SecAggLayer
from fedsim_strategies.dp_mean import DPMean
from fedsim_strategies.secagg_ddp import DistributedDPMean

DIM = 12


class RowNode:
    """One node through the SecAgg layer; its 'training' returns its topic row. ``drop``: the
    stage it stops answering at; ``rows``: the count it reports (default: its true one)."""

    def __init__(self, state_dir, partition_id, row, drop=None, rows=None, seen=None):
        self.node = {"state-dir": str(state_dir)}
        self.row, self.drop, self.rows = row, drop, rows
        self.seen = seen if seen is not None else []  # every reply the server receives
        self.layer = SecAggLayer(self, partition_id)

    def __call__(self, msg):
        node_local.attach(msg, self.node)
        if msg.content[keys.CONFIG].get(keys.OP) == self.drop:
            return None
        reply = self.layer.handle(msg)
        self.seen.append(reply)
        return reply

    def handle(self, msg):
        return RecordDict(
            {
                ARRAYS: to_record({"vectors": self.row[None, :]}),
                METRICS: MetricRecord({NUM_EXAMPLES: self.rows or 1}),
            }
        )


def topic_rows(n, seed=0):
    return np.random.default_rng(seed).dirichlet(np.ones(DIM), size=n)


def release(tmp_path, rows, drops=None, lies=None, sigma=1.0, seen=None, **settings):
    nodes = {
        i + 1: RowNode(tmp_path, i, r, (drops or {}).get(i + 1), (lies or {}).get(i + 1), seen=seen)
        for i, r in enumerate(rows)
    }
    messenger = Messenger(InProcessGrid(nodes), timeout=0.05, poll_seconds=0.001)
    wrapper = DistributedDPMean(DPMean(noise_multiplier=sigma), **settings)
    result = wrapper.start(
        messenger.grid("prior"),
        to_record({"vectors": np.full(DIM, 1.0 / DIM)}),
        1,
        30,
        ConfigRecord({SEED_KEY: 3, RUN_KEY: "ddp-test"}),
    )
    return result.arrays["vectors"].numpy(), wrapper, messenger


def test_the_server_sees_only_masked_inputs_and_the_noised_sum(tmp_path):
    """Every reply the server gets at the mask stage is a uint32 vector that is none of the
    clients' integer rows; the one sum it unmasks differs from the exact integer sum by noise of
    the stated size (not by 0)."""
    rows, seen = topic_rows(8), []
    mean, wrapper, _ = release(tmp_path, rows, seen=seen, sigma=2.0)
    bound = wrapper.bound
    masked = [r[keys.MASKED][keys.VECTOR].numpy() for r in seen if keys.MASKED in r]
    assert len(masked) == 8
    exact = np.round(rows * bound / np.maximum(np.linalg.norm(rows, axis=1), 1.0)[:, None])
    for vector in masked:  # each looks uniform mod 2^32: far from any row's integers (< B)
        assert np.median(np.abs(vector[1:].astype(np.int64))) > 2**20
    noised = wrapper.last_release.noised * len(rows)  # the noised sum, in units of C
    residual = noised - exact.sum(axis=0) / bound
    assert 0.5 * 2.0 < np.sqrt(np.mean(residual**2)) < 2.0 * 2.0 * np.sqrt(8 / 8)
    assert np.isclose(mean.sum(), 1.0) and (mean >= 0).all()


def test_more_dropouts_than_the_noise_is_sized_for_give_no_sum(tmp_path):
    """3 of 8 clients drop before masking, tolerance 0.25 (min_live 6): 5 inputs would carry 5/6
    of the stated variance; the round fails with the reason, nothing is released."""
    drops = {1: keys.MASK, 2: keys.MASK, 3: keys.MASK}
    with pytest.raises(PhaseFailed, match="noise is sized for"):
        release(tmp_path, topic_rows(8), drops=drops, dropout_tolerance=0.25)


def test_dropouts_within_tolerance_release_with_more_noise_than_stated(tmp_path):
    """2 of 10 drop before masking, tolerance 0.2: min_live 8; the sum of 8 carries exactly the
    stated variance and the reported epsilon is the guaranteed one; with none dropping, the sum
    carries 10/8 of it and a smaller epsilon is reported. One dropping after masking is live: its
    noised input is in the sum."""
    drops = {4: keys.MASK, 7: keys.MASK, 9: keys.CHECK}
    _, wrapper, _ = release(tmp_path, topic_rows(10), drops=drops, dropout_tolerance=0.2)
    figures = wrapper.rounds[1]
    assert figures["secagg-live"] == 8 and figures["ddp-min-live"] == 8
    assert wrapper.last_release.num_clients == 8
    assert wrapper.epsilon().reported == pytest.approx(wrapper.epsilon(1.0).reported)
    _, full, _ = release(tmp_path / "all", topic_rows(10), dropout_tolerance=0.2)
    assert full.epsilon().reported < full.epsilon(1.0).reported  # 10/8 of the variance


def test_a_client_masking_another_row_count_fails_the_round(tmp_path):
    with pytest.raises(PhaseFailed, match="masked another count"):
        release(tmp_path, topic_rows(6), lies={2: 2}, max_rows=2)


def test_the_release_is_dpmeans_mean_within_its_noise(tmp_path):
    """Large sigma-free check: at sigma 0.01 the release is the exact mean of the clipped rows
    within the noise and the rounding (a few 1e-4 at 40 rows)."""
    rows = topic_rows(40, seed=1)
    mean, wrapper, _ = release(tmp_path, rows, sigma=0.01, degree=10)
    exact = rows.mean(axis=0)
    assert np.abs(mean - exact).max() < 5e-3
    assert wrapper.rounds[1]["secagg-live"] == 40


@pytest.mark.parametrize(
    "settings, match",
    [
        ({"sigma": 0.0}, "noise_multiplier > 0"),
        ({"dropout_tolerance": 1.0}, "dropout_tolerance"),
        ({"scale_bits": 40}, "scale_bits"),
    ],
)
def test_bad_settings_refused_at_construction(settings, match):
    sigma = settings.pop("sigma", 1.0)
    with pytest.raises(ValueError, match=match):
        DistributedDPMean(DPMean(noise_multiplier=sigma), **settings)


def test_other_strategies_audit_and_sampling_refused():
    from flwr.serverapp.strategy import FedAvg

    with pytest.raises(ValueError, match="releases DPMean"):
        DistributedDPMean(FedAvg())
    with pytest.raises(ValueError, match="bench/privacy_audit.py"):
        DistributedDPMean(DPMean(audit_canaries=4))
    with pytest.raises(ValueError, match="sampling"):
        DistributedDPMean(DPMean(fraction_train=0.5))


def test_noise_plan_sizes_each_share_for_the_honest_survivors():
    plan = ddp.NoisePlan(1.0, 2**10, min_live=9, colluders=1)
    assert plan.share_variance == pytest.approx(2**20 / 8)
    assert plan.present_variance(9) == pytest.approx(2**20)  # 9 live, 1 of them unnoised


def test_the_server_cannot_redraw_a_clients_noise():
    """The noise comes from the client's own entropy (the layer draws a fresh generator per
    input, ``secagg_layer._noised_rows``): two inputs of one row under one public seed differ,
    so no public value regenerates and removes it (the central-DP audit's 'public seed' attack)."""

    class State:
        min_live = 0

    config = {
        keys.DDP_NOISE: 1.0,
        keys.DDP_BOUND: 2**12,
        keys.DDP_MIN_LIVE: 5,
        keys.DDP_COLLUDERS: 0,
        keys.DDP_CLIP: 1.0,
        keys.DDP_SIMPLEX: True,
        keys.DDP_ARRAY: "vectors",
    }
    row = {"vectors": np.full((1, 50), 1 / 50)}
    state = State()
    first = SecAggLayer._noised_rows(state, config, row)
    assert state.min_live == 5  # the node now signs no live set below 5
    assert not np.array_equal(first, SecAggLayer._noised_rows(State(), config, row))
