"""Flower's DP wrappers with their noise and client sampling drawn from the run's private noise source.

Flower's central-DP wrappers add their Gaussian noise with ``np.random.normal`` (numpy's global
generator, ``flwr.supercore.differential_privacy.add_gaussian_noise_inplace``), and so does the
adaptive wrappers' noisy clipped count. The ServerApp seeds that generator from the public run
seed (``fedsim/seeding.py``, for reproducible sampling), so anyone who knows the seed could
regenerate Flower's noise and subtract it. This wrapper runs each round's aggregation with the
global generator set from the run's :class:`~fedsim.privacy.dp.NoiseSource` (a stream of its own per
phase and round: two models released in one run never share noise) and puts the previous state
back afterwards.

Sampling: Flower's strategies sample a fixed number of clients with the module ``random``, which
the ServerApp seeds from the public run seed: whoever knows the seed knew who trained, and one
more client in the population changed which others were sampled, so a neighbouring population
changed the release by several clients' updates, not one. Under DP this wrapper samples instead:
each client of the grid (in its order, the partitions') on its own coin, Poisson sampling at the
strategy's ``fraction_train`` (its ``min_train_nodes`` does not apply: a Poisson sample has no
minimum), the coins drawn from the run's noise source; the strategy trains every client sampled.
Given the secret, an added client leaves the others' coins as they were: it adds its own clipped
update or nothing. The same secret (a resumed run) draws the same sample.

The wrappers' noise, sigma C / n, covers one client's effect on an unweighted mean of n clipped
updates. Two things the inner strategy does would break that, and this wrapper stops both:
FedAvg weights each reply by its ``num-examples`` (a client holding most of the data moves the
weighted mean by up to C, not C / n), so every reply's weight is set to 1 before aggregation; and
the mean is over the m replies (a Poisson sample's size varies, and failed or late clients are
counted as faults), whose sensitivity is C / m, so that round's noise is sigma C / m: the noise
multiplier, and with it the round's privacy cost, stays sigma. (A missing client cannot be
replaced by a zero update: Flower's clipping divides by the update's norm.) Flower's accounted
mode asks for equal weights and n replies too, but refuses instead, and only around a plain
FedAvg. Clipping and noise stay Flower's.

Every round the wrapper aggregates is one Gaussian release at noise multiplier sigma, recorded in
the run's :class:`~fedsim.privacy.dp.CentralDP` under the phase's label (the grid's), whose epsilon
goes into results.json and the summary (``fedsim/runtime/server_app.py``). A round is recorded as soon as
it has replies to aggregate: an adaptive wrapper releases its noisy clipped count before the mean.
A round no client was sampled for, or none replied to, releases nothing.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import numpy as np
from flwr.app import Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyClientSideAdaptiveClipping, Strategy

from fedsim.flower.strategies import KEY_NORM_BIT, DifferentialPrivacyAdaptiveBase
from fedsim.privacy.dp import (
    FLOWER_DP,
    SAMPLE,
    CentralDP,
    NoiseSource,
    adaptive_noise_multiplier,
    poisson_sample,
)
from fedsim.runtime.messaging import phase_grid
from fedsim.runtime.validators import Metrics, Number
from fedsim.seeding import derived_seed
from fedsim_strategies.wrapper import StrategyWrapper

log = logging.getLogger("fedsim")


@contextmanager
def global_numpy_from(rng: np.random.Generator):
    """numpy's global generator seeded from ``rng`` (a full MT19937 state, not a 32-bit seed)
    inside the block, the previous state after it."""
    previous = np.random.get_state()
    entropy = rng.integers(0, 2**63, size=8).tolist()
    np.random.set_state(
        np.random.RandomState(np.random.MT19937(np.random.SeedSequence(entropy))).get_state()
    )
    try:
        yield
    finally:
        np.random.set_state(previous)


def equal_weight(reply: Message, key: str) -> Message:
    """``reply`` with weight 1 under ``key`` in its metric records, in place as Flower's
    wrappers clip."""
    for name, record in reply.content.metric_records.items():
        if key in record:
            reply.content[name] = MetricRecord({**record, key: 1})
    return reply


def account(wrapper: Strategy, delta: float) -> CentralDP:
    """An empty account of ``wrapper``'s releases at ``delta``. An adaptive wrapper's round
    releases its update's noise (sigma_u) and its clipped count's (std s) at the effective
    multiplier of Andrew et al. 2021, which is the ``noise_multiplier`` it was configured with:
    Flower derived sigma_u from it and keeps only sigma_u."""
    mechanism = type(wrapper).__name__
    if not isinstance(wrapper, DifferentialPrivacyAdaptiveBase):
        return CentralDP(delta, mechanism, wrapper.noise_multiplier)
    update, count = wrapper.noise_multiplier, wrapper.clipped_count_stddev
    return CentralDP(
        delta,
        f"{mechanism} (update sigma {update:.4g}, clipped-count std {count:.4g}: the "
        "effective noise multiplier of Andrew et al. 2021, as Flower and TF-privacy compute it)",
        adaptive_noise_multiplier(update, count),
    )


class Among:
    """``grid`` with ``nodes`` as its population: the clients a round sampled, for the wrapped
    strategy to train every one of."""

    def __init__(self, grid, nodes: list[int]):
        self.grid, self.nodes = grid, nodes

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def __getattr__(self, name):
        return getattr(self.grid, name)


CLIPPED_BIT = Metrics({KEY_NORM_BIT: Number(0, 1, whole=True)})


def _clipped_bit(content: RecordDict, node: int) -> str | None:
    records = list(content.metric_records.values())
    return (
        "expected one MetricRecord" if len(records) != 1 else CLIPPED_BIT.problem(records[0], node)
    )


class NumpyNoise(StrategyWrapper):
    """``strategy`` (a Flower DP wrapper) with its global-numpy noise and its clients' sample from
    ``noise``; its releases counted in ``spent``."""

    def __init__(self, strategy: Strategy, noise: NoiseSource, spent: CentralDP):
        self.strategy = strategy
        self.noise = noise
        self.spent = spent
        self.phase = "train"  # the grid's label, once a round is configured
        inner = (
            strategy.strategy
        )  # trains every client this wrapper samples, at the rate it asked for
        self.rate = inner.fraction_train
        inner.fraction_train, inner.min_train_nodes, inner.min_available_nodes = 1.0, 0, 0

    def rng(self, use: int, server_round: int) -> np.random.Generator:
        """The noise source's stream for ``use`` in this phase's round ``server_round``."""
        return self.noise.rng(use, derived_seed(self.phase), server_round)

    def start(self, grid, initial_arrays, *args, **kwargs):
        """Flower's round loop; under client-side adaptive clipping every train reply must say
        whether its client clipped (Flower's wrapper raises on a reply without it)."""
        if isinstance(self.strategy, DifferentialPrivacyClientSideAdaptiveClipping):
            grid = phase_grid(grid, "dp").checked(MessageType.TRAIN, _clipped_bit)
        return super().start(grid, initial_arrays, *args, **kwargs)

    def configure_train(self, server_round, arrays, config, grid):
        self.phase = getattr(grid, "label", self.phase)  # a PhaseGrid names its phase
        if self.rate < 1:
            grid = Among(
                grid,
                poisson_sample(
                    list(grid.get_node_ids()), self.rate, self.rng(SAMPLE, server_round)
                ),
            )
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        key = self.strategy.strategy.weighted_by_key  # of the strategy inside Flower's wrapper
        replies = [equal_weight(r, key) for r in replies if not r.has_error()]
        if not replies:
            return None, None
        epsilon = self.spent.record(self.phase)
        log.info(
            "%s round %d: central DP epsilon %.4g at delta %g after %d releases (sigma %.4g, no "
            "amplification by sampling)",
            self.phase,
            server_round,
            epsilon,
            self.spent.delta,
            self.spent.releases[self.phase],
            self.spent.noise_multiplier,
        )
        sampled = self.strategy.num_sampled_clients
        self.strategy.num_sampled_clients = len(replies)  # the n of the noise: the mean's
        try:
            with global_numpy_from(self.rng(FLOWER_DP, server_round)):
                return self.strategy.aggregate_train(server_round, replies)
        finally:
            self.strategy.num_sampled_clients = sampled
