"""DP-SGD audited: gradient canaries sampled beside a client's records, scored from every step's
noised gradient (the view DP-SGD's accountant bounds), a measured lower bound beside the
reported epsilon (a record replaced: a canary out is a record of no gradient in its slot). A
broken mechanism (batches the server knows, no noise) is caught, the working one is not;
canaries pass through a causal LM's private SFT without touching the model."""

import numpy as np
import opacus.optimizers.optimizer
import pytest
import torch

from fedsim.privacy.audit import audit_release
from fedsim_tasks import dp_sgd as dp_sgd_module
from fedsim_tasks.causal_lm import load_policy, load_tokenizer, prepare_base, sft_train
from fedsim_tasks.dp_sgd import DP_EPSILON, GradientCanaries, PrivateSteps
from fedsim_tasks.test_causal_lm import encoder_dir, one_thread  # noqa: F401 (fixtures: a tiny BERT, one thread)
from fedsim_tasks.test_dp_sgd import LORA, dp_sgd

pytestmark = pytest.mark.slow  # a thousand DP-SGD steps per run

RECORDS, CANARIES, STEPS, PUBLIC_SEED = 100, 500, 1000, 0
SHARES = [0.1, 0.25, 0.5, 1.0]


def public_batches(
    num_samples: int, sample_rate: float, steps: int, generator=None
) -> list[list[int]]:
    """Poisson batches drawn from the run's public seed (fedsim's DP-SGD before e1b99cd): the
    server can draw them again."""
    rng = np.random.default_rng(PUBLIC_SEED)
    return [np.flatnonzero(rng.random(num_samples) < sample_rate).tolist() for _ in range(steps)]


def audited_linear():
    """A client's DP-SGD (sigma 1, rate 0.01, 1000 steps) of a linear model on 100 records, with
    500 canaries: the reported epsilon and the audit's bound (at 95%). The attackers are the threat
    model's, whatever the mechanism: one knowing the rate only, one that draws the batches again
    from the public seed (right only when the mechanism drew them from there)."""
    dp = dp_sgd(enabled=True, max_grad_norm=1.0, noise_multiplier=1.0)
    records = torch.randn(RECORDS, 3, generator=torch.Generator().manual_seed(1))
    model = torch.nn.Linear(3, 1, bias=False)
    canaries = GradientCanaries(CANARIES, np.random.default_rng(7))
    private = PrivateSteps(
        dp,
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        RECORDS,
        batch_size=1,
        horizon_steps=STEPS,
        noise_seed=3,
        canaries=canaries,
    )
    for idx in private.batches(STEPS):
        private.step(model(records[idx]).mean() if idx else None)
    private.close()
    sampled = np.array(
        [
            np.isin(np.arange(RECORDS, RECORDS + CANARIES), batch)  # the canaries' slots
            for batch in public_batches(RECORDS + CANARIES, private.rate, STEPS)
        ]
    )
    attacks = {
        "every step, batches secret": canaries.scores(private.rate, private.sigma),
        "every step, batches from the public seed": canaries.scores(
            private.rate, private.sigma, sampled
        ),
    }
    return audit_release(
        "dp-sgd",
        private.sigma,
        attacks,
        canaries.included,
        private.epsilon().reported,
        dp.delta,
        0.05,
        0.95,
        SHARES,
    )


def test_the_working_mechanism_holds():
    bound = audited_linear()
    assert bound.epsilon_upper == pytest.approx(
        2.85, abs=0.01
    )  # a record replaced; add-or-remove: 2.10
    assert 0 < bound.epsilon_lower < bound.epsilon_upper


def test_batches_the_server_knows_are_caught(monkeypatch):
    """The bug e1b99cd fixed: batches from the public seed. The accountant's amplification
    assumes the server does not know which steps used a record; knowing them, it sums those
    steps only."""
    monkeypatch.setattr(dp_sgd_module, "UniformWithReplacementSampler", public_batches)
    bound = audited_linear()
    assert bound.epsilon_lower > 3 > bound.epsilon_upper
    assert bound.attack == "every step, batches from the public seed"


def test_a_step_without_noise_is_caught(monkeypatch):
    """The mechanism is broken: Opacus is told sigma 1 (and accounts it) but adds no noise."""
    monkeypatch.setattr(
        opacus.optimizers.optimizer,
        "_generate_noise",
        lambda std, reference, generator=None, secure_mode=False: torch.zeros_like(reference),
    )
    bound = audited_linear()
    assert bound.epsilon_lower > 3 > bound.epsilon_upper


def test_canaries_pass_through_a_causal_lms_private_sft(encoder_dir, tmp_path):  # noqa: F811
    """Real records (question, answer) and 200 canaries in a tiny causal LM's DP-SGD (LoRA): the
    model trains, the canaries leave its weights alone, every step is observed, and the working
    mechanism's epsilon holds against the audit."""
    base = prepare_base(str(encoder_dir), tmp_path / "base", seed=0)
    tokenizer, model = load_tokenizer(base), load_policy(base, LORA, seed=0)
    records = [(f"question {i}? [SEP]", f" answer {i}.") for i in range(50)]
    canaries = GradientCanaries(200, np.random.default_rng(5))
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    dp = dp_sgd(enabled=True, max_grad_norm=0.1, noise_multiplier=1.0)
    stats = sft_train(
        model,
        tokenizer,
        records,
        steps=150,
        batch_size=2,
        lr=1e-2,
        max_length=32,
        seed=0,
        dp=dp,
        canaries=canaries,
    )
    assert len(canaries.observed) == 150 and np.isfinite(stats["loss"])
    assert all(
        n in before for n, p in model.named_parameters() if p.requires_grad
    )  # no canary weight added
    assert any(
        not torch.equal(before[n], p.detach())
        for n, p in model.named_parameters()
        if p.requires_grad
    )
    bound = audit_release(
        "sft",
        1.0,
        {"every step": canaries.scores(2 / len(records), 1.0)},
        canaries.included,
        stats[DP_EPSILON],
        dp.delta,
        0.05,
        0.95,
        SHARES,
    )
    assert bound.holds and bound.canaries == 200
