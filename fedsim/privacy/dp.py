"""Client-level Gaussian mechanism for a mean of vectors, and its epsilon.

Clipping, noising and the simplex step are a few lines of numpy: Flower's DP wrappers clip and
noise whole FedAvg model updates and cannot release a mean of arbitrary vectors with a custom
post-processing step, so this module does only that, and leaves accounting to Flower's
``RdpAccountant`` (``flwr.supercore.privacy_accounting``, backed by Google's dp-accounting).

That accountant is fedsim's only one, for ``dp_mean`` and for Flower's DP wrappers
(:class:`CentralDP`): Flower keeps it (validated configs and events, a serializable ledger, the
same code its wrappers' own ``accountant=`` mode runs), it names the sampling assumption of each
bound (Poisson, without replacement, none), and dp-accounting's RDP of the sampled Gaussian and
its RDP-to-(epsilon, delta) conversion are the reference implementation. fedsim does not use the
wrappers' ``accountant=`` mode itself: it takes fixed clipping around a plain
``FedAvg.aggregate_train`` only, and refuses a round with fewer replies than sampled, which
fedsim noises at sigma C / m instead (``fedsim_strategies/numpy_noise.py``).
"""

from __future__ import annotations

import logging
import math
import secrets
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from flwr.serverapp import GaussianPrivacyEvent, PrivacyConfig, RdpAccountant, SamplingMethod
from flwr.supercore.privacy_accounting import NeighboringRelation

logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting's convergence chatter


def clip_rows(vectors: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale every row to L2 norm at most ``clip_norm``."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors * np.minimum(1.0, clip_norm / np.maximum(norms, 1e-12))


def clamp_to_simplex(vector: np.ndarray) -> np.ndarray:
    """METHODS.md's post-processing: negatives to 0, renormalize (uniform if nothing is left)."""
    clamped = np.maximum(vector, 0.0)
    total = clamped.sum()
    return clamped / total if total > 0 else np.full_like(vector, 1.0 / len(vector))


@dataclass(frozen=True)
class NoiseSource:
    """Where a DP strategy's noise and client sampling come from.

    Private (the default): ``entropy`` is 256 bits nobody else knows (OS entropy, or a key derived
    from the run's secret so that a resumed run redraws the same noise, ``fedsim/privacy/secret.py``).
    Public (``privacy.reproducible_noise``, this machine only): ``entropy`` is the public seed, and
    anyone can regenerate the noise and subtract it: such a release is not private. Every draw
    names its purpose and index (``rng(RELEASE, round)``), so no two releases share noise.
    """

    entropy: int
    private: bool = True

    @classmethod
    def fresh(cls) -> NoiseSource:
        return cls(secrets.randbits(256))

    @classmethod
    def from_key(cls, key: bytes) -> NoiseSource:
        return cls(int.from_bytes(key, "big"))

    @classmethod
    def public(cls, seed: int) -> NoiseSource:
        return cls(int(seed), private=False)

    def rng(self, *labels: int) -> np.random.Generator:
        """An independent stream for one use (a release, a sweep point, a round's sample)."""
        return np.random.default_rng(np.random.SeedSequence(self.entropy, spawn_key=labels))


# a NoiseSource's uses (FLOWER_DP: fedsim_strategies/numpy_noise.py; AUDIT: an audit's coins, fedsim/privacy/audit.py)
RELEASE, SWEEP, SAMPLE, FLOWER_DP, AUDIT = 1, 2, 3, 4, 5
NOT_PRIVATE = ("privacy.reproducible_noise=true: the DP noise is drawn from the public seed, so "
               "anyone who knows the seed can remove it; these releases are NOT private")


def poisson_sample(nodes: list[int], rate: float, rng: np.random.Generator) -> list[int]:
    """Each node independently with probability ``rate``: the sampling the RDP accountant's
    amplification assumes (a fixed-size sample is another mechanism). The i-th node's coin is the
    i-th draw of ``rng``: one more node at the end leaves the others' coins as they were."""
    return [n for n, keep in zip(nodes, rng.random(len(nodes)) < rate) if keep]


@dataclass(frozen=True)
class Release:
    mean: np.ndarray
    num_clients: int
    noise_std: float  # std of the noise added to the sum


def gaussian_noise(rng: np.random.Generator, std: float, size) -> np.ndarray:
    """One release's noise: N(0, std^2) per coordinate from ``rng``, none drawn at std 0. The
    one way it is drawn, so that an audit's attacker who knows the stream regenerates it."""
    return rng.normal(0.0, std, size=size) if std > 0 else np.zeros(size)


def gaussian_mean(
    vectors: np.ndarray,
    clip_norm: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    simplex: bool,
    denominator: float | None = None,
) -> Release:
    """Clip rows to ``clip_norm``, sum, add N(0, sigma^2 C^2 I), divide by ``denominator``
    (default the row count; under Poisson sampling the expected count, so that the divisor does
    not reveal who was sampled). An empty matrix of ``dim`` columns releases noise alone."""
    if vectors.ndim != 2 or (len(vectors) == 0 and not denominator):
        raise ValueError(f"need a non-empty (clients, dim) matrix, got shape {vectors.shape}")
    std = noise_multiplier * clip_norm
    total = clip_rows(vectors, clip_norm).sum(axis=0) + gaussian_noise(rng, std, vectors.shape[1])
    mean = total / (denominator or len(vectors))
    return Release(clamp_to_simplex(mean) if simplex else mean, len(vectors), std)


def one_shot_epsilon(noise_multiplier: float, delta: float) -> float:
    """Classic Gaussian mechanism: epsilon = sqrt(2 ln(1.25 / delta)) / sigma (inf at sigma=0)."""
    if noise_multiplier <= 0:
        return math.inf
    return math.sqrt(2.0 * math.log(1.25 / delta)) / noise_multiplier


def rdp_epsilon(
    noise_multiplier: float, delta: float, rounds: int, sample_size: int, population: int
) -> float:
    """Epsilon after ``rounds`` identical releases by Flower's RDP accountant."""
    return rdp_epsilon_rounds(noise_multiplier, delta, [(sample_size, population)] * rounds)


def rdp_epsilon_rounds(noise_multiplier: float, delta: float, rounds: list[tuple[int, int]]) -> float:
    """Epsilon after one release per ``(sample_size, population)`` of ``rounds``, each accounted
    at its own rate: Poisson sampling at rate sample_size / population (what
    :func:`poisson_sample` does; rate 1 is full participation, no amplification)."""
    if noise_multiplier <= 0:
        return math.inf
    if not rounds:
        return 0.0
    populations = {population for _, population in rounds}
    if len(populations) != 1:
        raise ValueError(f"rounds over different populations {sorted(populations)}: the RDP "
                         "accountant composes releases over one population")
    return _composed_epsilon(delta, populations.pop(), SamplingMethod.POISSON, Counter(
        GaussianPrivacyEvent(noise_multiplier, size, population) for size, population in rounds))


def unamplified_epsilon(noise_multiplier: float, delta: float, releases: int) -> float:
    """Epsilon after ``releases`` Gaussian releases at ``noise_multiplier``, with no amplification
    by sampling: each release's RDP is that of the Gaussian mechanism, alpha / (2 sigma^2), so
    the bound holds however the clients were chosen (a fixed-size sample, a public one).
    Flower's wrappers account in this mode too (``accountant=``: no-amplification,
    add-or-remove-one client); the sample does not enter, so the event names a population of 1."""
    if noise_multiplier <= 0:
        return math.inf
    if releases == 0:
        return 0.0
    return _composed_epsilon(delta, 1, SamplingMethod.NO_AMPLIFICATION,
                             Counter({GaussianPrivacyEvent(noise_multiplier, 1, 1): releases}))


def _composed_epsilon(delta: float, population: int, sampling: SamplingMethod,
                      events: Counter[GaussianPrivacyEvent]) -> float:
    """Epsilon at ``delta`` of ``events`` (event -> how many times), composed by Flower's RDP
    accountant, add-or-remove-one client neighbours; equal events are composed at once."""
    accountant = RdpAccountant(PrivacyConfig(delta, population, NeighboringRelation.ADD_OR_REMOVE_ONE, sampling))
    for event, count in events.items():
        accountant.compose(event, count)
    return accountant.get_epsilon(delta)


def adaptive_noise_multiplier(update_noise_multiplier: float, clipped_count_stddev: float) -> float:
    """The noise multiplier of one adaptive-clipping round, the model update's noise and the
    clipped count's together (Andrew et al. 2021, "Differentially private learning with adaptive
    clipping", Thm. 1): (z_update^-2 + (2 sigma_count)^-2)^-1/2. Flower
    (``compute_adaptive_noise_params``) and TF-privacy (``QuantileAdaptiveClipSumQuery``) solve
    the same equation for z_update, given this multiplier. The 2: the paper's count sums bits
    centred at 1/2, which one client moves by 1/2. Flower counts 0/1 bits over the m replies;
    with m known, as the mean's divisor is, that count and the centred one are one release."""
    if update_noise_multiplier <= 0:
        return 0.0  # the update goes out unnoised: no guarantee, whatever the count's noise
    return (update_noise_multiplier ** -2 + (2 * clipped_count_stddev) ** -2) ** -0.5


SAMPLING = ("none claimed: every round is accounted as a Gaussian release without amplification "
            "by sampling. With a strategy's fraction_train < 1 each client is in a round on its own "
            "coin at that rate (Poisson sampling, fedsim_strategies/numpy_noise.py), drawn from the "
            "run's secret noise source: the public seed does not tell who trained, and one more "
            "client leaves the others' coins as they were, so a neighbouring population changes a "
            "round by that client's clipped update alone. Amplification would also need the number "
            "of replies kept secret, and results.json publishes it (the mean's divisor, the fault "
            "counts)")
COVERS = ("one client's whole contribution (add or remove one client) to the released global models "
          "and, under adaptive clipping, to the clipping norm; not what the strategy aggregates "
          "without noise (train metrics, update norms, the number of clients each round averaged and "
          "the fault counts in results.json and metrics.csv), and not against the server, which sees "
          "every client's update")


@dataclass
class CentralDP:
    """What a run's central-DP releases spent: Flower's DP wrappers, one release per aggregated
    round (``fedsim_strategies/numpy_noise.py``), per phase (a strategy's rounds, e.g. one
    method's model) and over the whole run (every phase composed: what publishing all the
    run's models costs). Accounted by :func:`unamplified_epsilon` at ``delta``, add-or-remove-one
    client neighbours, at the wrapper's (effective) ``noise_multiplier``."""

    delta: float
    mechanism: str           # the wrapper's class name
    noise_multiplier: float  # per round; adaptive: update and clipped count together
    releases: dict[str, int] = field(default_factory=dict)  # phase -> rounds released

    def record(self, phase: str) -> float:
        """One more release of ``phase``; the phase's epsilon so far."""
        self.releases[phase] = self.releases.get(phase, 0) + 1
        return self.epsilon(self.releases[phase])

    def epsilon(self, releases: int) -> float:
        return unamplified_epsilon(self.noise_multiplier, self.delta, releases)

    def report(self) -> dict:
        """results.json's ``privacy.central_dp``: the guarantee, its assumptions, per phase the
        epsilon after each round, and the run's total."""
        return {"mechanism": self.mechanism, "noise_multiplier": self.noise_multiplier,
                "delta": self.delta, "accountant": "RDP (Flower's RdpAccountant, dp-accounting), "
                                                   "add-or-remove-one client",
                "amplification_by_sampling": SAMPLING, "covers": COVERS,
                "epsilon_per_round": self.epsilon(1),
                "phases": {phase: {"rounds": n, "epsilon": self.epsilon(n),
                                   "epsilon_by_round": [self.epsilon(t) for t in range(1, n + 1)]}
                           for phase, n in self.releases.items()},
                "rounds": sum(self.releases.values()),
                "epsilon": self.epsilon(sum(self.releases.values()))}
