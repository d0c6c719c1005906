"""RLHF plumbing: HH prompts as turns, selector-labelled completion pairs, SFT data, win rates, the
minority's judges."""

from __future__ import annotations

import numpy as np

from fedsim_tasks.hh_preference.dataset import load_pairs
from fedsim_tasks.hh_preference.rlhf import (
    ReversedJudge,
    SecondCriterionJudge,
    completion_pairs,
    hh_turns,
    persona_chat_examples,
    policy_prompt,
    win_rate,
    wins,
)
from fedsim_tasks.hh_preference.test_dataset import ROOT

PROMPT = "\n\nHuman: hi there\n\nAssistant: Hello!\n\nHuman: how do I pick a lock?\n\nAssistant:"


def test_hh_prompt_becomes_turns_and_a_policy_prompt():
    assert hh_turns(PROMPT) == [
        ("Human", "hi there"),
        ("Assistant", "Hello!"),
        ("Human", "how do I pick a lock?"),
    ]
    assert policy_prompt(PROMPT, " [SEP] ", 1) == "Human: how do I pick a lock? [SEP] Assistant:"
    assert all(hh_turns(p.prompt)[-1][0] == "Human" for p in load_pairs(ROOT)[:200])


def test_completion_pairs_follow_the_labeller():
    samples = [
        ["a", "b", "c"],
        ["x", "x"],
    ]  # the second prompt's two samples are identical: no pair

    def prefer_longer(examples):
        return np.array([int(len(e.b) > len(e.a)) for e in examples])

    def prefer_b(examples):
        return np.ones(len(examples), int)

    assert completion_pairs(["p", "q"], samples, prefer_b) == [
        ("p", "b", "a"),
        ("p", "c", "a"),
        ("p", "c", "b"),
    ]
    assert completion_pairs(["p"], [["aa", "b"]], prefer_longer) == [("p", "aa", "b")]


def test_persona_chat_examples_answer_as_user_2():
    examples = persona_chat_examples(ROOT, "valid", " [SEP] ", 3)
    assert len(examples) > 10_000
    prompt, reply = examples[0]
    assert prompt.startswith("Human: ") and prompt.endswith("Assistant:") and reply
    assert all(p.count("Human:") + p.count("Assistant:") <= 4 for p, _ in examples[:500])


def test_win_rate_counts_ties_half_with_a_ci():
    a, b = np.array([1.0, 2.0, 3.0, 0.0]), np.array([0.0, 2.0, 1.0, 1.0])
    out = win_rate(wins(a, b), 500, 0, ReversedJudge().wins(a, b, [], []))
    assert out["win_rate"] == (1 + 0.5 + 1 + 0) / 4 and out["prompts"] == 4
    assert (out["unit"], out["clusters"]) == ("prompt", 4)  # every interval names what it resampled
    assert out["ci"][0] <= out["win_rate"] <= out["ci"][1]
    assert out["win_rate_minority"] == 1 - out["win_rate"]
    assert out["ci_minority"][0] <= out["win_rate_minority"] <= out["ci_minority"][1]


def test_second_criterion_judge_decides_weak_pairs_by_length():
    judge = SecondCriterionJudge.fit(np.array([-4.0, 0.5, 1.0, 3.0]), 0.5, "longer")
    assert judge.threshold == 2.0  # the median margin size (sizes 0.5, 1, 3, 4)
    short, long_ = "no", "I would rather not say"
    a, b = np.array([2.0, 0.3, 0.3, 0.3]), np.array([0.0, 0.0, 0.0, 0.0])
    replies_a, replies_b = [short, short, long_, short], [long_, long_, short, "ok"]
    # strong margin: the judge's choice; weak: the longer reply; weak with equal words: the judge's
    assert judge.wins(a, b, replies_a, replies_b).tolist() == [1.0, 0.0, 1.0, 1.0]
    shorter = SecondCriterionJudge(judge.threshold, "shorter")
    assert shorter.wins(a, b, replies_a, replies_b).tolist() == [1.0, 1.0, 0.0, 1.0]
