"""Record-level DP for a client's local training: DP-SGD through Opacus, for any torch loop.

Central DP (``fedsim_strategies/dp_mean.py``) protects a client from the people who read the
server's releases; it does nothing against the server itself, which sees each update. DP-SGD
protects each *training record* of a client from whoever sees the client's update (the server,
a network observer, other clients through the global model): every step samples records by
Poisson sampling (rate ``batch_size / n``, Opacus's ``UniformWithReplacementSampler``), clips
each record's gradient to ``max_grad_norm`` and adds Gaussian noise of std
``noise_multiplier * max_grad_norm`` to their sum (Opacus's ``GradSampleModule`` and
``DPOptimizer``, whose accountant hook records the steps taken). :func:`spent_epsilons` turns
the steps into the epsilon spent at ``delta`` for replacing one record by another, by RDP and by
PLD side by side (``fedsim.privacy.dp.replace_one_account``): each client's record count n is
public (its ``num-examples`` reply, the partitioning), and between data sets of n and n + 1
records that count alone tells them apart, so the add-or-remove epsilon holds for nothing fedsim
publishes; replacing a record keeps the count. Poisson amplification still holds: the server
does not know the batches. A task's loop turns it on with :class:`PrivateSteps`:

    steps = PrivateSteps(cfg, model, optimizer, n, batch_size, horizon)
    for idx in steps.batches(local_steps): loss = mean of per-record losses; steps.step(loss)
    steps.close(); ledger.add(account, steps.steps); spent_epsilons(ledger.history(), delta)

The batches and the noise are drawn from the OS's randomness, never the run's public seed: a
server knowing the seed would know which steps used a record (each such step a Gaussian release
without amplification: 6 known steps at sigma 1 are epsilon 32.2 at delta 1e-5 for a replaced
record, whatever the accountant says) and could subtract the noise. ``noise_seed`` exists for
tests only. Drawn so, a round trained again (a resumed run, a server that sends a round twice)
is a new release on new batches: the client's :class:`StepsLedger` counts every training it ran.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import dp_accounting
import numpy as np
import torch
from opacus import GradSampleModule
from opacus.accountants import RDPAccountant
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from fedsim.message_keys import DP_EPSILON, DP_EPSILON_PLD, DP_EPSILON_RDP
from fedsim.privacy.audit import fair_coins, sampled_gaussian_scores
from fedsim.privacy.dp import PLD_RESOLUTION, REPLACE_RECORD, Epsilon, replace_one_account

__all__ = [
    "DP_EPSILON",
    "DP_EPSILON_PLD",
    "DP_EPSILON_RDP",
    "DPSGD",
    "GradientCanaries",
    "PrivateSteps",
    "StepsLedger",
    "spent_epsilons",
]


@dataclass(frozen=True, kw_only=True)
class DPSGD:
    """DP-SGD settings of a client's local training (a method's ``dp_sgd`` block)."""

    enabled: bool  # clip and noise every record's gradient, account epsilon
    max_grad_norm: float  # per-record gradient clip norm C
    noise_multiplier: float | None  # noise std / C; or null and target_epsilon
    target_epsilon: float | None  # epsilon the whole run may spend per client; sets the noise
    delta: float  # delta of the (epsilon, delta) reported

    def __post_init__(self):
        """Refused before the run: a setting that would silently give no privacy or no training."""
        if not self.enabled:
            return
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("dp_sgd: set exactly one of noise_multiplier and target_epsilon")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"dp_sgd.max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.noise_multiplier is not None and not (
            math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0
        ):
            raise ValueError(
                f"dp_sgd.noise_multiplier must be > 0 (0 is no privacy), got {self.noise_multiplier}"
            )
        if self.target_epsilon is not None and not (
            math.isfinite(self.target_epsilon) and self.target_epsilon > 0
        ):
            raise ValueError(f"dp_sgd.target_epsilon must be > 0, got {self.target_epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"dp_sgd.delta must lie in (0, 1), got {self.delta}")

    def as_dict(self) -> dict:
        return asdict(self)


def _sampled_steps(sigma: float, rate: float, count: int) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), count
    )


def spent_epsilons(history: list, delta: float) -> Epsilon:
    """Epsilon at ``delta`` of the steps in ``history`` (Opacus's accountant's entries: noise
    multiplier, sample rate, steps) for replacing one record, by RDP and by PLD (the reported
    one the smaller, ``Epsilon.reported``). Entries of one noise and rate are one run of steps
    (composition does not care about order): a ledger of many rounds costs what one entry does."""
    runs = Counter()
    for sigma, rate, count in history:
        runs[float(sigma), float(rate)] += int(count)
    if not runs:
        return Epsilon(0.0, 0.0)
    steps = dp_accounting.ComposedDpEvent(
        [_sampled_steps(sigma, rate, count) for (sigma, rate), count in runs.items()]
    )
    return replace_one_account(steps, delta)


@functools.cache
def noise_for(target_epsilon: float, delta: float, rate: float, steps: int) -> float:
    """The noise multiplier whose ``steps`` at ``rate`` spend ``target_epsilon`` at ``delta`` for
    a replaced record, by dp-accounting's PLD under REPLACE_ONE at the step the reported epsilon
    uses (a share of the target), searched up from noise 0 (no privacy, nothing to compute) and 1."""
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: dp_accounting.pld.PLDAccountant(
                REPLACE_RECORD, PLD_RESOLUTION * target_epsilon
            ),
            lambda sigma: _sampled_steps(sigma, rate, steps),
            target_epsilon,
            delta,
            tol=1e-4,
        )
    )


class StepsLedger:
    """Every DP-SGD training a client ran on one set of records, in a file on its own disk: one
    JSON line per training (the account it spent, e.g. the method, and its steps), appended when
    the training ends. A client that read its account, trained and wrote it back lost a training
    that ended meanwhile (the same round sent twice, a timed-out round still running when the
    next came); an append loses none. The records' epsilon is over every account: whoever sees
    the updates (the server) sees every method's trainings on them."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def history(self, account: str | None = None) -> list:
        """The steps of every training that ended so far (of ``account`` only, if given)."""
        if not self.path.is_file():
            return []
        lines = [json.loads(line) for line in self.path.read_text().splitlines() if line]
        return [
            step for line in lines if account in (None, line["account"]) for step in line["steps"]
        ]

    def add(self, account: str, steps: list) -> None:
        """One training's steps, in one write to a file opened for appending (O_APPEND: no
        other append lands inside it)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps({"account": account, "steps": steps}) + "\n").encode())
        finally:
            os.close(fd)


class GradientCanaries:
    """Record-level canaries of DP-SGD (the privacy audit, ``fedsim/privacy/audit.py``): canary i is a
    record whose gradient is C e_i in a parameter of its own, which no real record reaches (the
    white-box Dirac canaries of Steinke et al. 2023 and Nasr et al. 2023: one canary never masks
    another, and the model's own weights are untouched). :class:`PrivateSteps` samples the
    canaries' slots beside the real records; an excluded canary's slot stays, with a record of
    no gradient: the canary replaced, the number of records the same either way, as the
    accountant's replace-one neighbours (each slot's coin is its own). The attacker of DP-SGD's
    accountant sees every step's noised gradient: :attr:`observed`, in units of C."""

    def __init__(self, count: int, rng: np.random.Generator | None = None):
        self.included = fair_coins(count, rng or np.random.default_rng(secrets.randbits(128)))
        self.param = torch.nn.Parameter(torch.zeros(count))
        self.observed: list[
            np.ndarray
        ] = []  # per step, each canary's coordinate of the noised gradient / C

    def __len__(self) -> int:
        return len(self.included)

    def add_rows(
        self, params: list[torch.nn.Parameter], slots: list[int], clip_norm: float
    ) -> None:
        """After the real records' backward: the sampled included canaries' per-record gradients,
        zero in every parameter but their own coordinate of :attr:`param`."""
        rows = [i for i in slots if self.included[i]]
        real = next(
            len(p.grad_sample) for p in params if p is not self.param and p.grad_sample is not None
        )
        for p in params:
            given = (
                p.grad_sample
                if p.grad_sample is not None
                else torch.zeros((real, *p.shape), dtype=p.dtype)
            )
            added = torch.zeros((len(rows), *p.shape), dtype=p.dtype)
            if p is self.param:
                added[range(len(rows)), rows] = clip_norm
            p.grad_sample = torch.cat([given, added])

    def observe(self, expected_batch_size: int, clip_norm: float) -> None:
        self.observed.append(self.param.grad.detach().numpy() * expected_batch_size / clip_norm)

    def scores(
        self, rate: float, noise_multiplier: float, sampled: np.ndarray | None = None
    ) -> np.ndarray:
        """Each canary's score from every step (:func:`fedsim.privacy.audit.sampled_gaussian_scores`)."""
        return sampled_gaussian_scores(np.array(self.observed), rate, noise_multiplier, sampled)


class PrivateSteps:
    """One local training call under DP-SGD: Poisson batches over ``num_examples`` records,
    per-record clipping and noise on ``optimizer``'s step, its steps accounted (a client's
    :class:`StepsLedger` composes them with its other trainings). ``horizon_steps``:
    the steps the whole run may take on these records (``target_epsilon`` is spent over them).
    The loss handed to :meth:`step` must be the mean of per-record losses, each depending on
    its own record only (a mean over the batch's tokens would couple records); the step is the
    noised sum of clipped per-record gradients over the *expected* batch size."""

    def __init__(
        self,
        cfg: DPSGD,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        num_examples: int,
        batch_size: int,
        horizon_steps: int,
        noise_seed: int | None = None,
        canaries: GradientCanaries | None = None,
    ):
        if not cfg.enabled:
            raise ValueError("PrivateSteps needs dp_sgd.enabled")
        if num_examples < 1:
            raise ValueError("no training records")
        self.cfg, self.rate = cfg, min(1.0, batch_size / num_examples)
        self.num_examples = num_examples
        self.sigma = cfg.noise_multiplier or noise_for(
            cfg.target_epsilon, cfg.delta, self.rate, max(horizon_steps, 1)
        )
        self.accountant = RDPAccountant()
        self.canaries, self._canary_slots = canaries, []
        if (
            canaries is not None
        ):  # clipped, noised and accounted with the model's weights; never moved
            optimizer.add_param_group({"params": [canaries.param], "lr": 0.0, "weight_decay": 0.0})
        self.module = GradSampleModule(model, loss_reduction="mean")  # hooks on the model's layers
        self.generator = torch.Generator().manual_seed(
            secrets.randbits(63) if noise_seed is None else noise_seed
        )
        self.optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=self.sigma,
            max_grad_norm=cfg.max_grad_norm,
            expected_batch_size=batch_size,
            loss_reduction="mean",
            generator=self.generator,
        )
        self.optimizer.attach_step_hook(self.accountant.get_optimizer_hook_fn(self.rate))

    def batches(self, steps: int) -> Iterator[list[int]]:
        """Poisson sampling, the accountant's assumption: each record joins each step's batch
        with probability ``rate`` (batches vary in size; an empty one still costs a step), drawn
        from this call's private generator. An audit's canary slots follow the records, at the
        same rate; the records' indices are yielded, the canaries' kept for :meth:`step`."""
        slots = self.num_examples + (len(self.canaries) if self.canaries else 0)
        for idx in UniformWithReplacementSampler(
            num_samples=slots, sample_rate=self.rate, generator=self.generator, steps=steps
        ):
            self._canary_slots = [i - self.num_examples for i in idx if i >= self.num_examples]
            yield [i for i in idx if i < self.num_examples]

    def step(self, loss: torch.Tensor | None) -> None:
        """Backward of the mean per-record loss, then the clipped, noised step (``None``: an
        empty batch, noise only, as DP-SGD's analysis assumes)."""
        self.optimizer.zero_grad(set_to_none=True)
        if loss is None:
            for p in self.optimizer.params:
                p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=p.device)
        else:
            loss.backward()
        if self.canaries is not None:
            self.canaries.add_rows(
                self.optimizer.params, self._canary_slots, self.cfg.max_grad_norm
            )
        self.optimizer.step()
        if self.canaries is not None:
            self.canaries.observe(self.optimizer.expected_batch_size, self.cfg.max_grad_norm)

    def close(self) -> None:
        """Take the hooks off the model (a process reuses it for other clients and evaluation)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.module.remove_hooks()

    @property
    def steps(self) -> list:
        """This call's steps (the accountant's entries), for the client's :class:`StepsLedger`."""
        return [list(h) for h in self.accountant.history]

    def epsilon(self) -> Epsilon:
        """This call's epsilon alone, a record replaced, by both accountants."""
        return spent_epsilons(self.steps, self.cfg.delta)
