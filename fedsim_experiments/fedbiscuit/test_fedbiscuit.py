"""FedBiscuit's protocol pieces run in process: each population's selector accuracy under a
minority that is not HH reversed, and reward-hacking curves on a tiny run (a tiny Llama trained
by one DPO run, scored by its labeller, the proxy, and a judge against the base at the
configured steps, on real HH prompts)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim_experiments.fedbiscuit.protocol import evaluate_selectors
from fedsim_experiments.fedbiscuit.rlhf import DPO_TRAINING, judges, reward_hacking
from fedsim_experiments.fedbiscuit.settings import RLHF
from fedsim_tasks.causal_lm import dpo_train, generate, load_policy, load_tokenizer
from fedsim_tasks.hf import trainable_arrays
from fedsim_tasks.hh_preference.dataset import Federation, load_pairs
from fedsim_tasks.hh_preference.rlhf import ReversedJudge, hacking_point, policy_prompt
from fedsim_tasks.hh_preference.test_dataset import LONGER, ROOT, task
from fedsim_tasks.test_causal_lm import llama_dir, one_thread  # noqa: F401 (fixtures)

LORA = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": None}


def settings(steps: str) -> RLHF:
    cfg = compose(
        [
            "experiment=fedbiscuit_paper",
            f"protocol.rlhf.hacking_steps={steps}",
            "protocol.rlhf.max_length=48",
            "protocol.rlhf.dpo_batch_size=2",
            "protocol.rlhf.dpo_lr=5e-2",
        ]
    )
    return RLHF(**OmegaConf.to_container(cfg.protocol.rlhf, resolve=True))


def prefer_longer(examples) -> np.ndarray:
    """The labeller standing in for the selectors: B (the policy's reply) when it is longer."""
    return np.array([int(len(e.b) > len(e.a)) for e in examples])


@pytest.mark.usefixtures("one_thread")
def test_curve_logs_proxy_and_judge_at_each_step_without_changing_the_training(llama_dir):  # noqa: F811
    tokenizer = load_tokenizer(llama_dir)
    hh = load_pairs(ROOT)[:6]
    prompts = [policy_prompt(p.prompt, "\n\n", 1) for p in hh]
    pairs = [
        (x, " " + " ".join(p.chosen.split()[:4]), " " + " ".join(p.rejected.split()[:4]))
        for x, p in zip(prompts, hh)
    ]
    r = settings("[2,4]")

    def replies(model) -> list[str]:
        return [c[0] for c in generate(model, tokenizer, prompts, max_new_tokens=6, seed=0)]

    def judge(texts) -> np.ndarray:  # the judge standing in: fewer characters score higher
        return -np.array([len(t) for t in texts], float)

    base = replies(load_policy(llama_dir, LORA, seed=0))

    def point(model) -> dict:
        own = replies(model)
        return hacking_point(
            prefer_longer,
            [p.prompt for p in hh],
            base,
            own,
            judge(own),
            judge(base),
            ReversedJudge(),
        )

    model = load_policy(llama_dir, LORA, seed=0)
    start = trainable_arrays(model)
    rows = reward_hacking(model, tokenizer, pairs, r, 0, point)
    assert [row["steps"] for row in rows] == [0, 2, 4]
    assert (
        rows[0]["proxy_win_rate"] == rows[0]["judge_win_rate"] == 0.5
    )  # before training: the base itself
    for row in rows:
        assert (
            0 <= row["proxy_win_rate"] <= 1
            and 0 <= row["judge_win_rate"] <= 1
            and row["reply_words"] >= 0
        )
        assert row["gap"] == pytest.approx(row["proxy_win_rate"] - row["judge_win_rate"])
        assert row["judge_win_rate_minority"] == pytest.approx(1 - row["judge_win_rate"])
    plain = load_policy(llama_dir, LORA, seed=0)  # one run of 4 steps with no scoring in between
    dpo_train(
        plain,
        tokenizer,
        pairs,
        steps=4,
        batch_size=r.dpo_batch_size,
        lr=r.dpo_lr,
        beta=r.beta,
        max_length=r.max_length,
        seed=DPO_TRAINING.seed(0),
    )
    trained, expected = trainable_arrays(model), trainable_arrays(plain)
    assert any(not np.array_equal(trained[k], start[k]) for k in trained)
    assert all(np.allclose(trained[k], expected[k], atol=1e-6) for k in trained)


def test_the_minority_judge_scores_the_policy_reply_against_the_base_reply():
    """versus() and hacking_point() give the minority judge the policy's reply as A and the
    base's as B: longer policy replies that HH's judge scores lower win for the length minority
    and lose for HH's judge (a swap of either argument fails this)."""
    from fedsim_experiments.fedbiscuit.rlhf import versus
    from fedsim_tasks.hh_preference.rlhf import SecondCriterionJudge

    minority = SecondCriterionJudge(np.inf, "longer")
    policy = (
        np.array([0.0, 0.0, 0.0]),
        ["a much longer reply here", "also a long reply", "long one too"],
    )
    base = (np.array([5.0, 5.0, 5.0]), ["short", "brief", "no"])
    out = versus(policy, base, minority, 200, 0)
    assert out["win_rate"] == 0.0 and out["win_rate_minority"] == 1.0
    point = hacking_point(
        lambda examples: np.ones(len(examples)),
        ["p"] * 3,
        base[1],
        policy[1],
        policy[0],
        base[0],
        minority,
    )
    assert (
        point["judge_win_rate"] == 0.0
        and point["judge_win_rate_minority"] == 1.0
        and point["gap"] == 1.0
    )


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("hacking_n", 3, "hacking_n=3 must be one of completions"),
        ("hacking_steps", [200, 60], "must ascend without repeats"),
        ("hacking_methods", [], "must be distinct selector_methods"),
        ("hacking_methods", ["fedbis", "fedbis"], "must be distinct selector_methods"),
        ("hacking_methods", ["central"], "must be distinct selector_methods"),
    ],
)
def test_wrong_curve_settings_are_refused(key, value, message):
    cfg = OmegaConf.to_container(
        compose(["experiment=fedbiscuit_paper"]).protocol.rlhf, resolve=True
    )
    with pytest.raises(ValueError, match=message):
        RLHF(**{**cfg, "hacking_steps": [60], key: value})


class LongerPicker:
    """A selector that prefers the response with more words (A on a tie); no weights."""

    def load(self, weights) -> None:
        pass

    def prob_b(self, examples) -> np.ndarray:
        return np.array([float(len(e.b.split()) > len(e.a.split())) for e in examples])


def test_each_population_is_scored_on_its_own_labels():
    """Under the second-criterion minority the minority's accuracy is measured on its own labels
    (here: on the minority's own test examples, another path than the protocol's), no longer
    1 - the majority's; under reversal it still is."""
    fed = Federation({**task(), "minority_preference": LONGER}, ROOT)
    picker = LongerPicker()
    scores = evaluate_selectors(picker, [{}], fed, 0.5)

    def accuracy(population: str) -> float:
        examples = fed.test(population)
        return float(
            np.mean((picker.prob_b(examples) > 0.5) == np.array([e.label for e in examples]))
        )

    assert scores["accuracy_majority"] == accuracy("majority")
    assert scores["accuracy_minority"] == accuracy("minority") > scores["accuracy_majority"]
    assert scores["accuracy_minority"] != 1 - scores["accuracy_majority"]
    reversed_scores = evaluate_selectors(picker, [{}], Federation(task(), ROOT), 0.5)
    assert reversed_scores["accuracy_minority"] == 1 - reversed_scores["accuracy_majority"]


class WordCountJudge:
    """A judge standing in for the TF-IDF one: more words score higher, except that a reply
    holding "sorry" scores 100 (so HH-like refusals are strongly preferred)."""

    def scores(self, prompts, responses) -> torch.Tensor:
        return torch.tensor(
            [100.0 if "sorry" in r.lower() else len(r.split()) / 10 for r in responses]
        )


def test_the_judges_report_each_population_and_the_minority_judge_follows_its_rule():
    """judges() on real HH test pairs: a minority that decides every pair by length is judged
    by length wherever the words differ, so its judge matches the minority's own labels (in the
    minority's own order of each pair, where a flipped pair comes reversed) on every pair but the
    few the rule leaves to the HH judge; the HH judge's agreement with a labeller is the share
    of test pairs they choose alike."""
    longer = {**LONGER, "weak_share": 1.0}
    fed = Federation({**task(), "minority_preference": longer}, ROOT)
    judge = WordCountJudge()
    minority, report = judges(
        judge, fed, OmegaConf.create(longer), LongerPicker(), {"longer": [{}]}
    )
    test = fed.test()
    a, b = [e.a for e in test], [e.b for e in test]
    prompts = [e.prompt for e in test]
    margins = (judge.scores(prompts, b) - judge.scores(prompts, a)).numpy()
    assert (
        minority.threshold == np.inf
    )  # every pair weak, as in the data: length decides wherever the words differ
    majority_b = margins > 0
    assert report["accuracy"] == np.mean(majority_b == np.array([e.label for e in test]))
    assert report["agreement"] == {
        "longer": np.mean(majority_b == (LongerPicker().prob_b(test) > 0.5))
    }
    left_to_judge = np.mean([len(x.split()) == len(y.split()) for x, y in zip(a, b)])
    assert left_to_judge < 0.1 and report["accuracy_minority"] >= 1 - left_to_judge
    reversed_minority, reversed_report = judges(
        judge, Federation(task(), ROOT), OmegaConf.create({"kind": "reversed"}), LongerPicker(), {}
    )
    assert isinstance(
        reversed_minority, ReversedJudge
    )  # the reversed judge on the reversed labels: as accurate
    ties = np.mean(margins == 0)  # (a tie picks A in either order: the one difference)
    assert abs(reversed_report["accuracy_minority"] - reversed_report["accuracy"]) <= ties


def test_summary_shows_the_reward_hacking_curves_and_the_minority_rule(tmp_path):
    """The summary of a run with curves: their table and plot; the note that the minority's
    accuracy is derived only where the minority is HH reversed."""
    from fedsim.results.outputs import RunOutput
    from fedsim_experiments.fedbiscuit.report import MINORITY_DERIVED, summary

    accuracy = {"accuracy_majority": 0.6, "accuracy_minority": 0.55, "accuracy": 0.58}
    curve = [
        {
            "steps": s,
            "proxy_win_rate": p,
            "judge_win_rate": j,
            "gap": p - j,
            "reply_words": 9.0,
            "mean_judge_reward": 0.1,
        }
        for s, p, j in ((0, 0.5, 0.5), (60, 0.7, 0.55))
    ]
    policy = {"win_rate": 0.6, "ci": [0.5, 0.7], "mean_reward": 0.2, "pairs": 10}
    r = {
        "selectors": {"fedbis": accuracy},
        "communication": {"fedbis": {"bytes_per_round": 1e6, "regroup_bytes": 0}},
        "groups": {},
        "warmup": {},
        "minority_share": {"clients": 0.33, "training_pairs": 0.3},
        "client_weights": "data_share",
        "minority_preference": {"kind": "second_criterion"},
        "policy": {"fedbis": {"4": policy}},
        "rlhf_reference": "fedbis",
        "rlhf": {
            "judge": {
                "pairs": 400,
                "accuracy": 0.6,
                "accuracy_minority": 0.58,
                "minority_judge": "SecondCriterionJudge",
                "agreement": {"fedbis": 0.61},
            },
            "base": {"sft": {}},
            "head_to_head": {},
            "reward_hacking": {"fedbis": curve},
        },
    }
    out = RunOutput(tmp_path)
    text = summary(r, out)
    assert (
        "## Reward hacking" in text
        and "| fedbis | 60 | 0.7" in text
        and MINORITY_DERIVED not in text
    )
    assert "SecondCriterionJudge: 0.580 on the minority's labels" in text and "fedbis 0.610" in text
    assert (tmp_path / "reward_hacking.png").exists()
    assert MINORITY_DERIVED in summary({**r, "minority_preference": {"kind": "reversed"}}, out)


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "protocol.methods.central_minority.population=minorty",
            "population='minorty' is not one of",
        ),
        ("protocol.methods.oracle_groups.num_selectors=2", "num_selectors must be >= 3"),
    ],
)
def test_a_wrong_method_setting_is_refused_before_the_run(override, message):
    from fedsim.config.compose import compose_checked

    with pytest.raises(Exception, match=message):
        compose_checked(["experiment=fedbiscuit_length", override])
