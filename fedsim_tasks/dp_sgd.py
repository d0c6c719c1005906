"""Record-level DP for a client's local training: DP-SGD through Opacus, for any torch loop.

Central DP (``fedsim_strategies/dp_mean.py``) protects a client from the people who read the
server's releases; it does nothing against the server itself, which sees each update. DP-SGD
protects each *training record* of a client from whoever sees the client's update (the server,
a network observer, other clients through the global model): every step samples records by
Poisson sampling (rate ``batch_size / n``, Opacus's ``UniformWithReplacementSampler``), clips
each record's gradient to ``max_grad_norm`` and adds Gaussian noise of std
``noise_multiplier * max_grad_norm`` to their sum (Opacus's ``GradSampleModule`` and
``DPOptimizer``); Opacus's RDP accountant turns the steps taken so far into the epsilon spent at
``delta``, and dp-accounting's PLD accountant the same steps into a tighter one beside it
(:func:`spent_epsilons`). A task's loop turns it on with :class:`PrivateSteps`:

    steps = PrivateSteps(cfg, model, optimizer, n, batch_size, horizon)
    for idx in steps.batches(local_steps): loss = mean of per-record losses; steps.step(loss)
    steps.close(); ledger.add(account, steps.steps); spent_epsilon(ledger.history(), delta)

The batches and the noise are drawn from the OS's randomness, never the run's public seed: a
server knowing the seed would know which steps used a record (each such step a Gaussian release
without amplification: 6 known steps at sigma 1 are epsilon 13.8 at delta 1e-5, whatever the
accountant says) and could subtract the noise. ``noise_seed`` exists for tests only. Drawn so, a
round trained again (a resumed run, a server that sends a round twice) is a new release on new
batches: the client's :class:`StepsLedger` counts every training it ran.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import dp_accounting
import numpy as np
import torch
from opacus import GradSampleModule
from opacus.accountants import RDPAccountant
from opacus.accountants.utils import get_noise_multiplier
from opacus.optimizers import DPOptimizer
from opacus.utils.uniform_sampler import UniformWithReplacementSampler

from fedsim.message_keys import DP_EPSILON, DP_EPSILON_PLD
from fedsim.privacy.audit import fair_coins, sampled_gaussian_scores
from fedsim.privacy.dp import Epsilon, account

__all__ = ["DP_EPSILON", "DP_EPSILON_PLD", "DPSGD", "GradientCanaries", "PrivateSteps", "StepsLedger",
           "spent_epsilon", "spent_epsilons"]


@dataclass(frozen=True, kw_only=True)
class DPSGD:
    """DP-SGD settings of a client's local training (a method's ``dp_sgd`` block)."""
    enabled: bool                   # clip and noise every record's gradient, account epsilon
    max_grad_norm: float            # per-record gradient clip norm C
    noise_multiplier: float | None  # noise std / C; or null and target_epsilon
    target_epsilon: float | None    # epsilon the whole run may spend per client; sets the noise
    delta: float                    # delta of the (epsilon, delta) reported

    def __post_init__(self):
        """Refused before the run: a setting that would silently give no privacy or no training."""
        if not self.enabled:
            return
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("dp_sgd: set exactly one of noise_multiplier and target_epsilon")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"dp_sgd.max_grad_norm must be > 0, got {self.max_grad_norm}")
        if self.noise_multiplier is not None and not (math.isfinite(self.noise_multiplier)
                                                      and self.noise_multiplier > 0):
            raise ValueError(f"dp_sgd.noise_multiplier must be > 0 (0 is no privacy), got {self.noise_multiplier}")
        if self.target_epsilon is not None and not (math.isfinite(self.target_epsilon) and self.target_epsilon > 0):
            raise ValueError(f"dp_sgd.target_epsilon must be > 0, got {self.target_epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"dp_sgd.delta must lie in (0, 1), got {self.delta}")

    def as_dict(self) -> dict:
        return asdict(self)


def spent_epsilon(history: list, delta: float) -> float:
    """Epsilon at ``delta`` of the steps in ``history`` (Opacus's RDP accountant's entries:
    noise multiplier, sample rate, steps)."""
    if not history:
        return 0.0
    accountant = RDPAccountant()
    accountant.history = [tuple(h) for h in history]
    return float(accountant.get_epsilon(delta))


def spent_epsilons(history: list, delta: float) -> Epsilon:
    """The steps of ``history`` by both accountants: Opacus's RDP (:func:`spent_epsilon`, what
    ``dp-epsilon`` has always reported) and dp-accounting's PLD of the same Poisson-sampled
    Gaussian steps (add or remove one record)."""
    if not history:
        return Epsilon(0.0, 0.0)
    steps = dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), count)
        for sigma, rate, count in history])
    return Epsilon(spent_epsilon(history, delta), account(steps, delta).pld)


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
        return [step for line in lines if account in (None, line["account"]) for step in line["steps"]]

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
    canaries' slots beside the real records; an excluded canary's slot stays with no gradient,
    which releases exactly what no record there would (each slot's coin is its own). The attacker
    of DP-SGD's accountant sees every step's noised gradient: :attr:`observed`, in units of C."""

    def __init__(self, count: int, rng: np.random.Generator | None = None):
        self.included = fair_coins(count, rng or np.random.default_rng(secrets.randbits(128)))
        self.param = torch.nn.Parameter(torch.zeros(count))
        self.observed: list[np.ndarray] = []  # per step, each canary's coordinate of the noised gradient / C

    def __len__(self) -> int:
        return len(self.included)

    def add_rows(self, params: list[torch.nn.Parameter], slots: list[int], clip_norm: float) -> None:
        """After the real records' backward: the sampled included canaries' per-record gradients,
        zero in every parameter but their own coordinate of :attr:`param`."""
        rows = [i for i in slots if self.included[i]]
        real = next(len(p.grad_sample) for p in params if p is not self.param and p.grad_sample is not None)
        for p in params:
            given = p.grad_sample if p.grad_sample is not None else torch.zeros((real, *p.shape), dtype=p.dtype)
            added = torch.zeros((len(rows), *p.shape), dtype=p.dtype)
            if p is self.param:
                added[range(len(rows)), rows] = clip_norm
            p.grad_sample = torch.cat([given, added])

    def observe(self, expected_batch_size: int, clip_norm: float) -> None:
        self.observed.append(self.param.grad.detach().numpy() * expected_batch_size / clip_norm)

    def scores(self, rate: float, noise_multiplier: float, sampled: np.ndarray | None = None) -> np.ndarray:
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

    def __init__(self, cfg: DPSGD, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 num_examples: int, batch_size: int, horizon_steps: int,
                 noise_seed: int | None = None, canaries: GradientCanaries | None = None):
        if not cfg.enabled:
            raise ValueError("PrivateSteps needs dp_sgd.enabled")
        if num_examples < 1:
            raise ValueError("no training records")
        self.cfg, self.rate = cfg, min(1.0, batch_size / num_examples)
        self.num_examples = num_examples
        self.sigma = cfg.noise_multiplier or get_noise_multiplier(
            target_epsilon=cfg.target_epsilon, target_delta=cfg.delta, sample_rate=self.rate,
            steps=max(horizon_steps, 1), accountant="rdp")
        self.accountant = RDPAccountant()
        self.canaries, self._canary_slots = canaries, []
        if canaries is not None:  # clipped, noised and accounted with the model's weights; never moved
            optimizer.add_param_group({"params": [canaries.param], "lr": 0.0, "weight_decay": 0.0})
        self.module = GradSampleModule(model, loss_reduction="mean")  # hooks on the model's layers
        self.generator = torch.Generator().manual_seed(secrets.randbits(63) if noise_seed is None else noise_seed)
        self.optimizer = DPOptimizer(optimizer, noise_multiplier=self.sigma, max_grad_norm=cfg.max_grad_norm,
                                     expected_batch_size=batch_size, loss_reduction="mean", generator=self.generator)
        self.optimizer.attach_step_hook(self.accountant.get_optimizer_hook_fn(self.rate))

    def batches(self, steps: int) -> Iterator[list[int]]:
        """Poisson sampling, the accountant's assumption: each record joins each step's batch
        with probability ``rate`` (batches vary in size; an empty one still costs a step), drawn
        from this call's private generator. An audit's canary slots follow the records, at the
        same rate; the records' indices are yielded, the canaries' kept for :meth:`step`."""
        slots = self.num_examples + (len(self.canaries) if self.canaries else 0)
        for idx in UniformWithReplacementSampler(num_samples=slots, sample_rate=self.rate,
                                                 generator=self.generator, steps=steps):
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
            self.canaries.add_rows(self.optimizer.params, self._canary_slots, self.cfg.max_grad_norm)
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
        """This call's epsilon alone, by both accountants."""
        return spent_epsilons(self.steps, self.cfg.delta)
