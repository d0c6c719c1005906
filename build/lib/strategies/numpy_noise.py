"""Flower's DP wrappers with their noise drawn from the run's private noise source.

Flower's central-DP wrappers add their Gaussian noise with ``np.random.normal`` (numpy's global
generator, ``flwr.supercore.differential_privacy.add_gaussian_noise_inplace``), and so does the
adaptive wrappers' noisy clipped count. The ServerApp seeds that generator from the public run
seed (``fedsim/seeding.py``, for reproducible sampling), so anyone who knows the seed could
regenerate Flower's noise and subtract it. This wrapper runs each round's aggregation with the
global generator set from the run's :class:`~fedsim.privacy.NoiseSource` (a stream of its own per
round) and puts the previous state back afterwards. Nothing else changes: clipping, noise scale
and accounting stay Flower's.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
from flwr.serverapp.strategy import Strategy

from fedsim.privacy import FLOWER_DP, NoiseSource


@contextmanager
def global_numpy_from(rng: np.random.Generator):
    """numpy's global generator seeded from ``rng`` (a full MT19937 state, not a 32-bit seed)
    inside the block, the previous state after it."""
    previous = np.random.get_state()
    entropy = rng.integers(0, 2**63, size=8).tolist()
    np.random.set_state(np.random.RandomState(np.random.MT19937(np.random.SeedSequence(entropy))).get_state())
    try:
        yield
    finally:
        np.random.set_state(previous)


class NumpyNoise(Strategy):
    """``strategy`` (a Flower DP wrapper) with its global-numpy noise from ``noise``."""

    def __init__(self, strategy: Strategy, noise: NoiseSource):
        self.strategy = strategy
        self.noise = noise

    def summary(self) -> None:
        self.strategy.summary()

    def configure_train(self, server_round, arrays, config, grid):
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        with global_numpy_from(self.noise.rng(FLOWER_DP, server_round)):
            return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(self, server_round, arrays, config, grid):
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round, replies):
        return self.strategy.aggregate_evaluate(server_round, replies)
