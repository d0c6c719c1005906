"""Flower's DP wrappers inside NumpyNoise aggregate what their noise (sigma C / n) covers: an
unweighted mean over n, whatever the clients' example counts and however many replied."""

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)

from fedsim.privacy.dp import NoiseSource
from fedsim_strategies.adaptive_clipping import ServerSideAdaptiveClipping
from fedsim_strategies.conftest import NodeIds
from fedsim_strategies.numpy_noise import NumpyNoise, account

DIM = 20_000


def _reply(node: int, first: float, examples: int, loss: float) -> Message:
    update = np.zeros(DIM)
    update[0] = first
    return Message(
        RecordDict(
            {
                "arrays": ArrayRecord({"w": Array(update)}),
                "metrics": MetricRecord({"num-examples": examples, "loss": loss}),
            }
        ),
        dst_node_id=node,
        message_type=MessageType.TRAIN,
    )


def _aggregate(wrapper, n: int, replies: list[Message], sigma: float = 0.0):
    clip = (
        {"initial_clipping_norm": 1.0, "clipped_count_stddev": 1.0}
        if "Adaptive" in wrapper.__name__
        else {"clipping_norm": 1.0}
    )
    dp = wrapper(FedAvg(fraction_train=1.0), noise_multiplier=sigma, num_sampled_clients=n, **clip)
    strategy = NumpyNoise(dp, NoiseSource.public(0), account(dp, 1e-5))
    list(
        strategy.configure_train(
            1, ArrayRecord({"w": Array(np.zeros(DIM))}), ConfigRecord(), NodeIds(n)
        )
    )
    arrays, metrics = strategy.aggregate_train(1, replies)
    return strategy, arrays["w"].numpy(), metrics


@pytest.mark.parametrize(
    "wrapper",
    [DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyClientSideFixedClipping],
)
def test_every_client_weighs_the_same_under_dp(wrapper):
    """A client with 99 of 100 examples would move FedAvg's weighted mean by 0.99 C, not C / 2."""
    _, w, metrics = _aggregate(wrapper, 2, [_reply(1, 0.5, 99, 1.0), _reply(2, -0.5, 1, 3.0)])
    assert w[0] == pytest.approx(0.0) and metrics["loss"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "wrapper", [DifferentialPrivacyServerSideFixedClipping, ServerSideAdaptiveClipping]
)
def test_the_noise_follows_the_clients_that_replied(wrapper):
    """Two of three sampled clients reply: the mean is over two, so the noise is sigma C / 2
    (the noise multiplier, the round's privacy cost, stays sigma), 1.5 times the noise when all
    three reply; the next round's n is three again."""
    replies = [_reply(1, 0.2, 5, 1.0), _reply(2, 0.4, 7, 3.0), _reply(3, 0.3, 9, 2.0)]
    strategy, w, metrics = _aggregate(wrapper, 3, replies[:2], sigma=1.0)
    full = _aggregate(wrapper, 3, [_reply(1, 0.2, 5, 1.0), *replies[1:]], sigma=1.0)[1]
    assert np.std(w[1:]) / np.std(full[1:]) == pytest.approx(1.5, rel=0.03)
    assert metrics["loss"] == pytest.approx(2.0) and strategy.strategy.num_sampled_clients == 3
