"""DP-SGD (Opacus) for a client's local training: per-record clipping and noise really happen,
the epsilon is reported for replacing one record (the client's record count is public), by RDP
and by PLD (never above RDP), and grows with the steps (also across calls, through a client's
ledger), the batches are no function of the run's seed, the model is left without hooks, and
wrong settings are refused before a run."""

from __future__ import annotations

from functools import cache

import dp_accounting
import pytest
import torch
from dp_accounting import pld
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim.config.schema import check
from fedsim.privacy.dp import account
from fedsim_tasks import causal_lm
from fedsim_tasks.causal_lm import load_policy, load_tokenizer, prepare_base, sft_train
from fedsim_tasks.dp_sgd import (
    DP_EPSILON,
    DP_EPSILON_PLD,
    DP_EPSILON_RDP,
    DPSGD,
    PrivateSteps,
    StepsLedger,
    spent_epsilons,
)
from fedsim_tasks.test_causal_lm import encoder_dir, one_thread  # noqa: F401 (fixtures: a tiny BERT, one thread)

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["query", "value"]}
EXAMPLES = [
    ("hello there [SEP]", " i am fine, thanks."),
    ("how are you? [SEP]", " fine."),
    ("what is your name? [SEP]", " my name is bob."),
    ("where do you live? [SEP]", " in paris."),
]


@cache
def _paper_dp_sgd() -> dict:
    return OmegaConf.to_container(compose(["experiment=feddtre_paper"]).protocol.generator.dp_sgd)


def steps_event(sigma: float, rate: float, steps: int) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps
    )


def replace_one_pld(sigma: float, rate: float, steps: int, delta: float) -> float:
    """What a reader who knows each client's record count (its ``num-examples`` reply, the public
    partitioning) can be promised at most: dp-accounting's PLD of the Poisson-sampled steps for
    replacing one record (``REPLACE_ONE``: the count the same for both neighbours), finely
    discretized; no fedsim code."""
    accountant = pld.PLDAccountant(
        dp_accounting.NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4
    )
    return float(accountant.compose(steps_event(sigma, rate, steps)).get_epsilon(delta))


def dp_sgd(**settings) -> DPSGD:
    """feddtre_paper's ``dp_sgd`` block with ``settings`` over it: conf/ holds the values the
    test does not set, not a second copy here."""
    return DPSGD(**{**_paper_dp_sgd(), **settings})


def _linear_steps(dp: DPSGD, records: torch.Tensor, steps: int = 1, batch_size: int | None = None):
    """SGD (lr 1) under DP-SGD on a linear model whose per-record loss is x . w: the step is
    -(sum of clipped per-record gradients x_i + noise) / expected batch size (by default every
    record, rate 1)."""
    model = torch.nn.Linear(records.shape[1], 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    private = PrivateSteps(
        dp,
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        len(records),
        batch_size=batch_size or len(records),
        horizon_steps=steps,
        noise_seed=0,
    )
    for idx in private.batches(steps):
        private.step(model(records[idx]).mean() if idx else None)
    private.close()
    return model.weight.detach().ravel(), private


def test_each_record_is_clipped_and_noise_is_added():
    records = torch.tensor([[300.0, 400.0], [0.0, 0.5]])  # norms 500 and 0.5; batch = both (rate 1)
    tiny_noise = dp_sgd(enabled=True, max_grad_norm=1.0, noise_multiplier=1e-9)
    w, _ = _linear_steps(tiny_noise, records)
    # plain SGD would move w by -(300.5, 400.5) / 2; clipped: -((0.6, 0.8) + (0, 0.5)) / 2
    torch.testing.assert_close(w, torch.tensor([-0.3, -0.65]), atol=1e-6, rtol=0)
    zero = torch.zeros(64, 2)  # no gradient at all: whatever moves is the noise, std sigma C / B
    w, _ = _linear_steps(dp_sgd(enabled=True, max_grad_norm=1.0, noise_multiplier=2.0), zero)
    assert 0 < float(w.norm()) < 1.0 and abs(float(w.std()) - 2.0 / 64) < 2.0 / 64


def test_epsilon_grows_with_steps_and_carries_over_rounds(tmp_path):
    """A client's ledger across two trainings (a round, then the next, or a resumed run in another
    process reading the same file) spends what one training of all their steps would."""
    dp = dp_sgd(enabled=True, max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5)
    records = torch.randn(100, 3)
    _, two = _linear_steps(dp, records[:, :], steps=2)
    _, four = _linear_steps(dp, records, steps=4)
    assert 0 < two.epsilon().rdp < four.epsilon().rdp and 0 < two.epsilon().pld < four.epsilon().pld
    assert four.epsilon().pld <= four.epsilon().rdp
    StepsLedger(tmp_path / "ledger.jsonl").add("a", two.steps)
    ledger = StepsLedger(tmp_path / "ledger.jsonl")  # resumed: a new process, the same file
    assert spent_epsilons(ledger.history(), dp.delta) == two.epsilon()
    ledger.add("a", two.steps)  # the same 2 steps again: as much as 4 steps at once
    summed = spent_epsilons(ledger.history("a"), dp.delta)
    assert (summed.rdp, summed.pld) == pytest.approx(
        (four.epsilon().rdp, four.epsilon().pld), rel=1e-9
    )
    assert summed.reported >= replace_one_pld(1.0, 1.0, 4, dp.delta)
    ledger.add("b", four.steps)
    assert spent_epsilons(ledger.history(), dp.delta).reported > four.epsilon().reported


def test_the_epsilon_holds_with_the_record_count_published():
    """Attack: the client's record count is public (its ``num-examples`` reply, the partitioning),
    so adding or removing a record shows in the count alone, whatever the noise: the add-or-remove
    epsilon (Opacus's RDP, 3.82 for 150 steps at rate 0.04 and sigma 1) holds for nothing a reader
    sees. Replacing one record leaves the count as it is: what is reported must be at least
    dp-accounting's replace-one PLD of the same steps (4.74), by each accountant and the smaller."""
    dp = dp_sgd(enabled=True, max_grad_norm=1.0, noise_multiplier=1.0, delta=1e-5)
    _, private = _linear_steps(dp, torch.randn(50, 3), steps=150, batch_size=2)
    spent, published = private.epsilon(), replace_one_pld(1.0, 2 / 50, 150, dp.delta)
    assert published == pytest.approx(4.74, abs=0.01)
    assert published <= spent.reported == spent.pld <= spent.rdp


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
def test_replace_one_is_above_add_or_remove_and_pld_below_rdp(rate):
    """On a grid of noise and steps: the add-or-remove numbers <= dp-accounting's replace-one PLD
    <= the reported PLD <= the reported RDP (an upper bound of its own: from the add-or-remove RDP
    by the triangle inequality of Renyi divergences, ``fedsim.privacy.dp.replace_one_account``)."""
    for sigma in (0.8, 1.0, 4.0):
        for steps in (1, 30, 300):
            spent = spent_epsilons([(sigma, rate, steps)], 1e-5)
            removed = account(steps_event(sigma, rate, steps), 1e-5)
            replaced = replace_one_pld(sigma, rate, steps, 1e-5)
            assert removed.pld <= replaced * (1 + 1e-3), (sigma, steps, spent, removed)
            assert replaced * (1 - 1e-3) <= spent.pld <= spent.rdp, (sigma, steps, spent, replaced)
            assert removed.rdp <= spent.rdp and spent.reported == spent.pld


def test_target_epsilon_sets_the_noise_for_the_horizon():
    """``target_epsilon`` is spent over the horizon by the epsilon reported (replace one record),
    not by the add-or-remove one: the noise that reaches it is larger."""
    dp = dp_sgd(enabled=True, target_epsilon=3.0, delta=1e-5)
    records = torch.randn(40, 3)
    _, private = _linear_steps(dp, records, steps=6)  # the horizon is these 6 steps
    assert private.sigma > 0 and private.epsilon().reported == pytest.approx(3.0, rel=0.01)
    assert private.epsilon().reported <= 3.0 * 1.001
    assert replace_one_pld(private.sigma, private.rate, 6, dp.delta) <= 3.0 * 1.001


def test_an_empty_poisson_batch_still_takes_a_noised_step():
    dp = dp_sgd(enabled=True, max_grad_norm=1.0, noise_multiplier=1.0)
    model = torch.nn.Linear(2, 1, bias=False)
    private = PrivateSteps(
        dp, model, torch.optim.SGD(model.parameters(), lr=1.0), 1000, 1, 1, noise_seed=0
    )
    before = model.weight.detach().clone()
    private.step(None)
    private.close()
    assert not torch.equal(before, model.weight.detach()) and private.epsilon().reported > 0


def test_sft_under_dp_sgd_trains_differently_reports_epsilon_and_leaves_no_hooks(
    encoder_dir,  # noqa: F811
    tmp_path,
):
    base = prepare_base(str(encoder_dir), tmp_path / "base", seed=0)
    tokenizer = load_tokenizer(base)
    runs = {}
    for name, dp in {
        "plain": None,
        "dp": dp_sgd(enabled=True, max_grad_norm=0.1, noise_multiplier=1.0),
    }.items():
        model = load_policy(base, LORA, seed=0)
        start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        stats = sft_train(
            model,
            tokenizer,
            EXAMPLES,
            steps=3,
            batch_size=2,
            lr=1e-2,
            max_length=32,
            seed=0,
            dp=dp,
            **({"noise_seed": 0} if dp else {}),
        )
        moved = {n: (p.detach() - start[n]) for n, p in model.named_parameters() if p.requires_grad}
        runs[name] = stats, moved, model
    (plain, plain_moved, _), (dp_stats, dp_moved, model) = runs["plain"], runs["dp"]
    assert (
        DP_EPSILON not in plain
        and dp_stats[DP_EPSILON] > 0
        and sum(h[2] for h in dp_stats["dp-steps"]) == 3
    )
    assert dp_stats[DP_EPSILON] >= replace_one_pld(1.0, 2 / len(EXAMPLES), 3, 1e-5)
    assert 0 < dp_stats[DP_EPSILON_PLD] == dp_stats[DP_EPSILON] <= dp_stats[DP_EPSILON_RDP]
    assert all(torch.isfinite(d).all() for d in dp_moved.values())
    assert any(not torch.allclose(dp_moved[n], plain_moved[n]) for n in plain_moved)
    assert not any(
        m._forward_hooks or m._backward_hooks for m in model.modules()
    )  # reusable for the next client


def test_two_runs_with_one_seed_draw_different_batches_at_the_same_epsilon(
    encoder_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """Attack: the server knows the run's seed; if the batches came from it, it would know which
    steps used a record, and each of those steps would be a Gaussian release without
    amplification (6 such steps at sigma 1: epsilon 32.2 for a replaced record, whatever the
    accountant said). The batches are Poisson samples from randomness the client keeps: one
    seed, two calls, other batches, and the same reported epsilon (it depends on the rate and
    the steps only)."""
    base = prepare_base(str(encoder_dir), tmp_path / "base", seed=0)
    tokenizer, records = (
        load_tokenizer(base),
        [(f"question {i}? [SEP]", f" answer {i}.") for i in range(40)],
    )
    real, batches = causal_lm._completion_logprobs, []

    def recorded(model, tokenizer, prompts, *args, **kwargs):
        batches[-1].append(sorted(prompts))
        return real(model, tokenizer, prompts, *args, **kwargs)

    monkeypatch.setattr(causal_lm, "_completion_logprobs", recorded)
    epsilons = []
    for _ in range(2):
        batches.append([])
        stats = sft_train(
            load_policy(base, LORA, seed=0),
            tokenizer,
            records,
            steps=6,
            batch_size=4,
            lr=1e-2,
            max_length=32,
            seed=0,
            dp=dp_sgd(enabled=True, max_grad_norm=0.1, noise_multiplier=1.0),
        )
        epsilons.append(stats[DP_EPSILON])
    assert batches[0] != batches[1]
    assert epsilons[0] == epsilons[1] > 0


@pytest.mark.parametrize(
    "settings, why",
    [
        ({"enabled": True}, "exactly one"),
        ({"enabled": True, "noise_multiplier": 1.0, "target_epsilon": 2.0}, "exactly one"),
        ({"enabled": True, "noise_multiplier": 0.0}, "noise_multiplier"),
        ({"enabled": True, "noise_multiplier": 1.0, "max_grad_norm": -1.0}, "max_grad_norm"),
        ({"enabled": True, "target_epsilon": 1.0, "delta": 1.0}, "delta"),
    ],
)
def test_wrong_settings_are_refused(settings, why):
    with pytest.raises(ValueError, match=why):
        dp_sgd(**settings)


def test_wrong_settings_are_refused_before_the_run():
    with pytest.raises(ValueError, match="exactly one"):
        check(compose(["experiment=feddtre_paper", "protocol.generator.dp_sgd.enabled=true"]))
    with pytest.raises(ValueError, match="FedProx"):
        check(
            compose(
                [
                    "experiment=feddtre_paper",
                    "protocol.generator.dp_sgd.enabled=true",
                    "protocol.generator.dp_sgd.noise_multiplier=1.0",
                ]
            )
        )
    ok = check(
        compose(
            [
                "experiment=feddtre_paper",
                "protocol.generator.dp_sgd.enabled=true",
                "protocol.generator.dp_sgd.noise_multiplier=1.0",
                "~protocol.methods.fedprox",
            ]
        )
    )
    assert ok.generator.dp_sgd.noise_multiplier == 1.0
