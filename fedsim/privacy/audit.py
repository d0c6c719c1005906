"""An empirical privacy audit: a measured lower bound on epsilon beside each accountant's upper one.

An accountant's epsilon holds only under the assumptions it is handed (noise nobody else can
draw, a sample nobody knows, the noise multiplier it was told). The audit measures instead, in
the run itself (Steinke, Nasr & Jagielski, "Privacy auditing with one (1) training run",
NeurIPS 2023): m canaries are put into the run, each in or out on a secret fair coin; an
attacker who sees what the threat model lets it see (a released mean, every step's noised
gradient) scores every canary, guesses "in" for the highest scores and "out" for the lowest, and
the number of right guesses bounds epsilon from below at a stated confidence. A lower bound above
the accountant's epsilon means the guarantee does not hold, and the run fails
(:func:`enforce`).

A one-run bound is weak (a few hundred canaries cannot refute an epsilon above ~3.5, nor a noise
multiplier half the one claimed at sigma 4), and it looks at one release at a time. So the server,
which knows the exact clipped sum a central-DP release noised, also checks the noise itself, over
all the run's releases together (:func:`noise_check`, :func:`shared_noise_check`): each release's
noise against its claimed sigma (a chi-square test of its size, whose power against a shortfall
is written beside it), and the releases' noise against each other (two releases sharing a draw,
or any combination of releases that cancels the noise, make their noise linearly dependent).

Written here rather than imported, because no package on PyPI offers the one-run bound without
a framework fedsim does not use: jax_privacy 2.0.0's ``auditing`` module has it
(``CanaryScoreAuditor.epsilon_one_run``; the module itself is numpy and scipy), but
``jax_privacy/__init__`` imports jax, optax and chex, which its wheel requires;
ml_privacy_meter's DP-audit guide is scripts in its repository (PyPI's ``privacy-meter`` 1.0.1
predates it); ``privacy-estimates`` 0.1.0 bounds epsilon from false-positive and false-negative
rates over independent trainings (not one run's guesses with abstentions); ``auditml`` 0.1.0 has
membership-inference attacks only. What is written here is the paper's p-value
(:func:`p_value`, equal to jax_privacy's ``_one_run_p_value``) on ``scipy.stats.binom``, its root
by ``scipy.optimize.brentq``, and the two attackers fedsim's mechanisms need
(:class:`MeanCanaries`, :func:`sampled_gaussian_scores`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit
from scipy.stats import binom, chi2


class PrivacyAuditFailed(RuntimeError):
    """A measured lower bound on epsilon exceeds the accountant's: the reported guarantee is false."""


def p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """How likely ``correct`` or more right guesses out of ``guesses`` are, among ``canaries``
    canaries each in or out on a fair coin, if the mechanism were (epsilon, delta)-DP: Steinke et
    al. 2023, Theorem 3.1 (the main result; Appendix D computes it the same way),
    P[W >= v] <= f(v) + 2 m delta max_{i >= 1} (f(v - i) - f(v)) / i, with
    f(v) = P[Binomial(r, e^eps / (1 + e^eps)) >= v], r guesses, v right, m canaries."""
    q = float(expit(epsilon))
    tail = float(binom.sf(correct - 1, guesses, q))
    if delta == 0 or correct == 0:
        return min(tail, 1.0)
    shifts = np.arange(1, correct + 1)
    worst = float(np.max((binom.sf(correct - shifts - 1, guesses, q) - tail) / shifts))
    return min(tail + 2 * canaries * delta * worst, 1.0)


def epsilon_lower_bound(
    canaries: int, guesses: int, correct: int, delta: float, significance: float
) -> float:
    """The largest epsilon that (epsilon, delta)-DP is refuted at (p-value below ``significance``;
    0: none is). The p-value grows with epsilon: the root of p_value - significance."""
    if guesses == 0 or p_value(canaries, guesses, correct, 0.0, delta) >= significance:
        return 0.0
    high = 1.0
    while p_value(canaries, guesses, correct, high, delta) < significance:
        high *= 2
    return float(
        brentq(
            lambda eps: p_value(canaries, guesses, correct, eps, delta) - significance,
            high / 2 if high > 1 else 0.0,
            high,
            xtol=1e-6,
        )
    )


def fair_coins(count: int, rng: np.random.Generator) -> np.ndarray:
    """Which of ``count`` canaries are in the run: a fair coin each, from a stream the attacker
    does not know."""
    return rng.random(count) < 0.5


@dataclass(frozen=True)
class Bound:
    """One release's audit: the accountant's epsilon and the measured lower bound beside it."""

    release: str  # what was audited (a release's name)
    noise_multiplier: float  # the sigma the accountant was told
    epsilon_upper: float  # the accountant's (inf: no noise, nothing claimed)
    epsilon_lower: float  # measured: at least this, at ``confidence`` (with the run's other bounds)
    delta: float
    confidence: float  # of all the run's lower bounds together (Bonferroni)
    canaries: int
    guesses: int  # of the attack and guess count that gave the bound
    correct: int
    attack: str

    @property
    def holds(self) -> bool:
        """The accountant's epsilon is not refuted."""
        return self.epsilon_lower <= self.epsilon_upper

    def as_dict(self) -> dict:
        return {**asdict(self), "holds": self.holds}


# A table of bounds, in this order (a run's summary adds "holds"; the audit bench prints these)
BOUND_COLUMNS = (
    "release",
    "noise_multiplier",
    "epsilon_upper",
    "epsilon_lower",
    "canaries",
    "guesses",
    "correct",
    "confidence",
    "attack",
)


def guesses_at(scores: np.ndarray, included: np.ndarray, share: float) -> tuple[int, int]:
    """(guesses, right ones) when ``share`` of the canaries are guessed: "in" for the highest
    half of those, "out" for the lowest half. Ties go by canary index, which the coins do not
    depend on."""
    per_side = min(len(scores) // 2, max(1, round(share * len(scores) / 2)))
    order = np.argsort(scores, kind="stable")
    right = int(included[order[len(scores) - per_side :]].sum()) + int(
        (~included[order[:per_side]]).sum()
    )
    return 2 * per_side, right


def audit_release(
    release: str,
    noise_multiplier: float,
    attacks: dict[str, np.ndarray],
    included: np.ndarray,
    epsilon_upper: float,
    delta: float,
    significance: float,
    confidence: float,
    shares: list[float],
) -> Bound:
    """The best lower bound over every attack's scores and every guessed share, each tested at
    ``significance`` / (attacks x shares): trying several cannot raise the chance of a false
    bound above ``significance`` (Bonferroni)."""
    each = significance / (len(attacks) * len(shares))
    best = None
    for attack, scores in attacks.items():
        for share in shares:
            guesses, right = guesses_at(np.asarray(scores, float), included, share)
            eps = epsilon_lower_bound(len(included), guesses, right, delta, each)
            if best is None or eps > best.epsilon_lower:
                best = Bound(
                    release,
                    float(noise_multiplier),
                    float(epsilon_upper),
                    eps,
                    delta,
                    confidence,
                    len(included),
                    guesses,
                    right,
                    attack,
                )
    return best


METHOD = (
    "one-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023, Theorem 3.1): canaries each in or out "
    "on a secret fair coin, guesses from what the threat model's attacker sees, a lower bound on "
    "epsilon at delta from the right guesses; where the server knows the exact sum, each release's "
    "noise against its claimed sigma (chi-square) and the releases' noise against each other "
    "(Bartlett); Bonferroni over the run's checks, attacks and guess counts"
)


SHORTFALLS = (
    1.1,
    1.25,
    1.5,
    2.0,
)  # noise std below the claim by these factors: each check's power against them


@dataclass(frozen=True)
class NoiseCheck:
    """One release's noise against its claimed noise multiplier: the residual (the noised sum
    minus the exact clipped sum, in units of C) has squared norm sigma^2 chi^2(d) if the claim
    holds; a smaller one is a shortfall."""

    release: str
    noise_multiplier: float  # claimed
    measured: float  # the residual's root mean square over C: the multiplier it shows
    coordinates: int
    p_value: float  # the chance of a residual this small at the claimed sigma
    significance: float  # the run's share of 1 - confidence for this check
    power: list[dict]  # per shortfall f (noise std the claim's / f): the chance this check fails it
    shortfall_at_90: float  # the shortfall it catches 9 times in 10

    @property
    def holds(self) -> bool:
        return self.p_value >= self.significance

    def power_at(self, shortfall: float) -> float:
        return next(p["power"] for p in self.power if p["shortfall"] == shortfall)

    def as_dict(self) -> dict:
        return {**asdict(self), "holds": self.holds}


def noise_check(
    release: str, noise_multiplier: float, residual: np.ndarray, significance: float
) -> NoiseCheck:
    """Test ``residual`` (the release's noise in units of C, one entry per coordinate) against
    N(0, sigma^2 I): the lower tail of chi^2(d) at sum (r / sigma)^2. Its power against a
    shortfall f (noise std sigma / f) is exact: P[chi^2(d) < f^2 q], q the test's critical value."""
    d = len(residual)
    critical = float(chi2.ppf(significance, d))
    return NoiseCheck(
        release,
        float(noise_multiplier),
        float(np.sqrt(np.mean(residual**2))),
        d,
        float(chi2.cdf(float(np.sum((residual / noise_multiplier) ** 2)), d)),
        significance,
        [{"shortfall": f, "power": float(chi2.cdf(f * f * critical, d))} for f in SHORTFALLS],
        float(np.sqrt(chi2.ppf(0.9, d) / critical)),
    )


@dataclass(frozen=True)
class SharedNoise:
    """Whether a run's releases drew their noise apart: Bartlett's test that their standardized
    residuals are uncorrelated, -(d - (2k + 5) / 6) ln det R ~ chi^2(k (k - 1) / 2) for k releases
    of d coordinates, R their correlation matrix. Two releases sharing one draw, or any linear
    combination of releases that cancels the noise, make R singular (p = 0)."""

    releases: list[str]
    statistic: float
    p_value: float
    significance: float
    largest_correlation: float  # of any two releases' residuals
    pair: list[str]  # those two

    @property
    def holds(self) -> bool:
        return self.p_value >= self.significance

    def as_dict(self) -> dict:
        return {
            **asdict(self),
            "statistic": self.statistic if np.isfinite(self.statistic) else None,
            "holds": self.holds,
        }


def shared_noise_check(
    names: list[str], standardized: np.ndarray, significance: float
) -> SharedNoise:
    """Bartlett's test of sphericity over the rows of ``standardized`` (one release's residual
    over its sigma C each; their mean is known to be 0, so the correlations are not centred).
    Needs more coordinates than releases."""
    k, d = standardized.shape
    if not 2 <= k < d:
        raise ValueError(
            f"the shared-noise check needs 2 to {d - 1} releases of {d} coordinates, got {k}"
        )
    gram = standardized @ standardized.T
    scale = np.sqrt(np.diag(gram))
    if not np.all(scale > 0):  # a release without noise: nothing independent about it
        silent = [names[i] for i in np.flatnonzero(scale == 0)]
        return SharedNoise(list(names), np.inf, 0.0, significance, 1.0, (silent * 2)[:2])
    correlation = gram / np.outer(scale, scale)
    sign, logdet = np.linalg.slogdet(correlation)
    statistic = -(d - (2 * k + 5) / 6) * logdet if sign > 0 else np.inf
    off = np.abs(correlation - np.eye(k))
    i, j = np.unravel_index(np.argmax(off), off.shape)
    return SharedNoise(
        list(names),
        float(statistic),
        float(chi2.sf(statistic, k * (k - 1) // 2)),
        significance,
        float(off[i, j]),
        [names[i], names[j]],
    )


@dataclass(frozen=True)
class AuditReport:
    """A run's audit: every audited release's bound, what the canaries were put into, and (where
    the server checked them) each release's noise and the releases' noise together."""

    bounds: list[Bound]
    covers: str
    noise: list[NoiseCheck] = field(default_factory=list)
    shared: SharedNoise | None = None

    def failures(self) -> list[str]:
        """What does not hold, one sentence each."""
        return (
            [
                f"{b.release} (accountant {b.epsilon_upper:.3f}, measured at least {b.epsilon_lower:.3f} "
                f"at confidence {b.confidence:g}: {b.correct} of {b.guesses} guesses right, attack "
                f"'{b.attack}')"
                for b in self.bounds
                if not b.holds
            ]
            + [
                f"{c.release} (noise multiplier {c.noise_multiplier:g} claimed, {c.measured:.3g} measured "
                f"over {c.coordinates} coordinates: p = {c.p_value:.3g})"
                for c in self.noise
                if not c.holds
            ]
            + (
                [
                    f"{', '.join(self.shared.releases)} together (their noise is not independent: "
                    f"p = {self.shared.p_value:.3g}; {self.shared.pair[0]} and {self.shared.pair[1]} "
                    f"correlate at {self.shared.largest_correlation:.3f})"
                ]
                if self.shared is not None and not self.shared.holds
                else []
            )
        )

    def as_dict(self) -> dict:
        """results.json's ``privacy.audit``: each release's epsilon_upper beside its epsilon_lower,
        and its noise check."""
        return {
            "method": METHOD,
            "covers": self.covers,
            "holds": not self.failures(),
            "releases": [b.as_dict() for b in self.bounds],
            **({"noise": [c.as_dict() for c in self.noise]} if self.noise else {}),
            **({"shared_noise": self.shared.as_dict()} if self.shared is not None else {}),
        }

    def enforce(self) -> None:
        """Fail the run when any release's measured lower bound exceeds its accountant's epsilon,
        or its noise falls short of its claim, or releases share noise."""
        broken = self.failures()
        if broken:
            raise PrivacyAuditFailed(
                "privacy audit: the reported epsilon does not hold for " + "; ".join(broken)
            )

    def plot(self, ax) -> None:
        """Both bounds against sigma on a matplotlib axis."""
        bounds = sorted(self.bounds, key=lambda b: b.noise_multiplier)
        sigma = [b.noise_multiplier for b in bounds]
        upper = [b.epsilon_upper if np.isfinite(b.epsilon_upper) else np.nan for b in bounds]
        ax.plot(sigma, upper, "o-", label="epsilon_upper (accountant)")
        ax.plot(
            sigma,
            [b.epsilon_lower for b in bounds],
            "s--",
            label=f"epsilon_lower (audit, {bounds[0].canaries} canaries, confidence {bounds[0].confidence:g})",
        )
        ax.set_xlabel("noise multiplier sigma")
        ax.set_ylabel(f"epsilon at delta={bounds[0].delta:g}")
        ax.set_yscale("symlog", linthresh=0.1)
        ax.legend()


@dataclass(frozen=True)
class MeanCanaries:
    """Client-level canaries of a clipped Gaussian mean of rows (:func:`fedsim.privacy.dp.gaussian_mean`):
    canary i is a client whose row is C e_j, j = ``coords[i]``, a coordinate of its own among
    those the other clients weigh least (Dirac canaries: one canary never masks another), or,
    on its coin, the zero row: replace-one neighbours, as the accountant's (the count of rows is
    the same either way). DP's attacker knows every other client's row; it scores a canary by how
    far the release's coordinate lies above the midpoint of what it would be with and without that
    canary's row."""

    coords: np.ndarray  # each canary's coordinate
    included: np.ndarray  # the secret coins
    clip_norm: float
    known: np.ndarray  # the other clients' clipped rows, summed

    @classmethod
    def place(
        cls, known: np.ndarray, count: int, clip_norm: float, rng: np.random.Generator
    ) -> MeanCanaries:
        """``count`` canaries on the coordinates where ``known`` (the other clients' clipped rows,
        summed) weighs least, each in on a coin from ``rng``."""
        if not 2 <= count <= len(known) // 2:
            raise ValueError(
                f"privacy.audit.canaries must be in [2, {len(known) // 2}] (half the "
                f"release's {len(known)} coordinates), got {count}"
            )
        return cls(
            np.argsort(known, kind="stable")[:count], fair_coins(count, rng), clip_norm, known
        )

    def rows(self) -> np.ndarray:
        """Every canary's row: C e_j if its coin put it in, else 0."""
        return self.clip_norm * np.eye(len(self.known))[self.coords] * self.included[:, None]

    def scores(
        self, released: np.ndarray, simplex: bool, noise: np.ndarray | None = None
    ) -> np.ndarray:
        """Each canary's score from the ``released`` mean (on the simplex when ``simplex``), with the
        noise the attacker believes was drawn subtracted (``noise``; None: it knows none). The
        release's scale (its divisor, and the simplex's renormalization) is read off the
        coordinates no canary holds: what they should sum to over what they do."""
        expected = self.known + (0.0 if noise is None else noise)  # the sum without any canary
        clamp = (lambda v: np.maximum(v, 0.0)) if simplex else (lambda v: v)
        others = np.ones(len(released), bool)
        others[self.coords] = False
        observed_mass = float(np.sum(released[others]))
        scale = float(np.sum(clamp(expected[others]))) / observed_mass if observed_mass else 1.0
        if not (np.isfinite(scale) and scale > 0):
            scale = 1.0
        absent, present = (
            clamp(expected[self.coords]),
            clamp(expected[self.coords] + self.clip_norm),
        )
        return released[self.coords] * scale - (absent + present) / 2

    def attacks(
        self, released: np.ndarray, simplex: bool, public_noise: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The two attackers of a released mean: one who knows no noise, and one who regenerated
        it from the public seed (``public_noise``), which removes it exactly when the release drew
        from there (``privacy.reproducible_noise``, or a bug)."""
        return {
            "release": self.scores(released, simplex),
            "release minus the public seed's noise": self.scores(released, simplex, public_noise),
        }


def sampled_gaussian_scores(
    steps: np.ndarray, rate: float, noise_multiplier: float, sampled: np.ndarray | None = None
) -> np.ndarray:
    """Each canary's log-likelihood ratio, in over out, from every step's noised gradient in its
    coordinate (``steps``: steps x canaries, in units of the clip norm: b s_t + sigma z, b the coin,
    s_t whether the step sampled it). The attacker of DP-SGD's accountant sees every step; it
    knows a step sampled a canary with probability ``rate``, or exactly which steps did
    (``sampled``, a batch it could regenerate): log(1 - p + p exp((x - 1/2) / sigma^2)) per step,
    p the rate or the 0/1 it knows."""
    p = np.full(steps.shape, rate) if sampled is None else np.asarray(sampled, float)
    with np.errstate(divide="ignore"):  # log 0 = -inf: a step known not to sample it adds 0
        per_step = np.logaddexp(
            np.log1p(-p), np.log(p) + (steps - 0.5) / max(noise_multiplier, 1e-6) ** 2
        )
    return per_step.sum(axis=0)
