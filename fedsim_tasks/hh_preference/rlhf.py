"""The RLHF phase's data plumbing (METHODS.md section 4): policy prompts from HH dialogues,
completion pairs labelled by selectors, the base policy's dialogue data, and win rates.

The base policy is first taught to answer (SFT) on Synthetic-Persona-Chat, general chit-chat
that holds no HH preference, so whatever preference the aligned policies show comes from the
selectors' labels (or, for the baselines, the clients' pairs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from fedsim.results.stats import paired_bootstrap_ci
from fedsim_tasks.causal_lm import format_prompt
from fedsim_tasks.dialogue.dataset import examples, persona_chat
from fedsim_tasks.hh_preference.dataset import ASSISTANT, HUMAN, Example


def hh_turns(prompt: str) -> list[tuple[str, str]]:
    """``"\\n\\nHuman: a\\n\\nAssistant: b ... \\n\\nAssistant:"`` as [("Human", "a"), ("Assistant", "b"), ...]
    without the final empty Assistant cue."""
    turns, rest = [], prompt
    markers = {HUMAN: "Human", ASSISTANT: "Assistant"}
    while rest:
        head = min((rest.find(m), m) for m in markers if rest.find(m) >= 0)
        rest = rest[head[0] + len(head[1]) :]
        nxt = [i for i in (rest.find(HUMAN), rest.find(ASSISTANT)) if i >= 0]
        text, rest = (rest[: min(nxt)], rest[min(nxt) :]) if nxt else (rest, "")
        turns.append((markers[head[1]], text.strip()))
    return turns[:-1] if turns and turns[-1] == ("Assistant", "") else turns


def policy_prompt(prompt: str, sep: str, context_turns: int) -> str:
    """The policy's input for an HH prompt: its last ``context_turns`` turns, ending with the
    Assistant cue."""
    return format_prompt(hh_turns(prompt)[-context_turns:], sep)


def persona_chat_examples(
    data_root: str, split: str, sep: str, context_turns: int
) -> list[tuple[str, str]]:
    """(prompt, reply) for every User 2 turn of Synthetic-Persona-Chat ``split``, User 1 as the
    Human and User 2 as the Assistant, with up to ``context_turns`` turns of context (no persona)."""
    return [
        (e.prompt, e.reply)
        for e in examples(persona_chat(data_root, split), sep, context_turns, 0, ["User 2"])
    ]


def completion_pairs(
    prompts: list[str],
    completions: list[list[str]],
    prefer_b: Callable[[list[Example]], np.ndarray],
) -> list[tuple[str, str, str]]:
    """Every pair of distinct completions of each prompt, labelled by ``prefer_b`` (1: B preferred),
    as DPO's (prompt index, chosen, rejected) with the HH prompt kept by index in ``prompts``."""
    examples = [
        Example(i, prompts[i], a, b, -1)
        for i, outs in enumerate(completions)
        for a, b in combinations(dict.fromkeys(outs), 2)
        if a.strip() and b.strip()
    ]
    if not examples:
        return []
    labels = prefer_b(examples)
    return [
        (prompts[e.pair_id], e.b, e.a) if y else (prompts[e.pair_id], e.a, e.b)
        for e, y in zip(examples, labels)
    ]


def wins(scores_a: np.ndarray, scores_b: np.ndarray) -> np.ndarray:
    """Per prompt, 1 where reply A scores above reply B, 0.5 on a tie, else 0."""
    return (scores_a > scores_b) + 0.5 * (scores_a == scores_b)


class ReversedJudge:
    """The reversed minority's judge: the HH judge reversed (its labels are HH's reversed)."""

    def wins(self, scores_a, scores_b, replies_a, replies_b) -> np.ndarray:
        return 1 - wins(scores_a, scores_b)


@dataclass(frozen=True)
class SecondCriterionJudge:
    """The second-criterion minority's preference (``dataset.minority_flips``) judged with the HH
    judge in place of HH's label: the judge's choice where its margin is strong, the ``prefer``
    reply in words (a tie in words keeps the judge's choice) where the margin's size is below
    ``threshold``, the ``weak_share`` quantile of its sizes on the held-out test pairs (infinite
    at ``weak_share`` 1: every pair is weak, as in the data). In the data "weak" is the HH
    probe's margin signed toward HH's label; replies have no HH label, so here it is the
    margin's size: below 1 the rule is an approximation of the data's."""

    threshold: float
    prefer: str

    @classmethod
    def fit(cls, test_margins: np.ndarray, weak_share: float, prefer: str) -> SecondCriterionJudge:
        return cls(
            np.inf if weak_share >= 1 else float(np.quantile(np.abs(test_margins), weak_share)),
            prefer,
        )

    def wins(self, scores_a, scores_b, replies_a, replies_b) -> np.ndarray:
        sign = 1 if self.prefer == "longer" else -1
        longer = sign * np.array(
            [len(a.split()) - len(b.split()) for a, b in zip(replies_a, replies_b)]
        )
        weak = (np.abs(scores_a - scores_b) < self.threshold) & (longer != 0)
        return np.where(weak, (longer > 0).astype(float), wins(scores_a, scores_b))


def win_rate(
    prompt_wins: np.ndarray,
    resamples: int,
    seed: int,
    minority_wins: np.ndarray,
    length_diff: np.ndarray | None = None,
) -> dict:
    """How often reply A beats reply B on the same prompts (``prompt_wins``, ties counted half),
    and the same by the minority's judge (``minority_wins``), each with a paired bootstrap 95% CI
    over prompts: the held-out prompts are the unit (``task.unit``), each its own cluster, so the
    bootstrap over items is the one over clusters, named as such. With ``length_diff`` (A's words
    minus B's, per prompt) each also length-controlled (:func:`length_controlled`: ``*_lc``)."""
    lo, hi = paired_bootstrap_ci(prompt_wins, resamples, seed)
    out = {
        "win_rate": float(prompt_wins.mean()),
        "ci": [lo, hi],
        "prompts": int(prompt_wins.size),
        "unit": "prompt",
        "clusters": int(prompt_wins.size),
        "win_rate_minority": float(minority_wins.mean()),
        "ci_minority": list(paired_bootstrap_ci(minority_wins, resamples, seed)),
    }
    if length_diff is not None:
        for key, w in (("win_rate", prompt_wins), ("win_rate_minority", minority_wins)):
            lc = length_controlled(w, length_diff)
            out[f"{key}_lc"], out[f"{key.replace('win_rate', 'ci')}_lc"] = lc["value"], lc["ci"]
            out[f"{key}_length_slope"] = lc["slope"]
        out["length_diff_words"] = float(np.mean(length_diff))
    return out


def length_controlled(prompt_wins: np.ndarray, length_diff: np.ndarray) -> dict:
    """The win rate at equal length: the intercept of an OLS regression (statsmodels) of each
    prompt's win (1, 0.5, 0) on the two replies' difference in words, with its HC3 heteroscedasticity-
    robust 95% CI and the slope (win per word). Where every difference is the same, no slope can
    be fitted: the mean, the interval of a constant-only fit, slope null."""
    import statsmodels.api as sm

    y = np.asarray(prompt_wins, dtype=float)
    d = np.asarray(length_diff, dtype=float)
    if y.size < 3 or np.ptp(y) == 0:
        return {"value": float(y.mean()), "ci": [float(y.mean())] * 2, "slope": None}
    design = np.ones((y.size, 1)) if np.ptp(d) == 0 else sm.add_constant(d, has_constant="add")
    fit = sm.OLS(y, design).fit(cov_type="HC3")
    lo, hi = fit.conf_int(0.05)[0]
    return {
        "value": float(fit.params[0]),
        "ci": [float(lo), float(hi)],
        "slope": None if design.shape[1] == 1 else float(fit.params[1]),
    }


def words(replies) -> np.ndarray:
    return np.array([len(r.split()) for r in replies], dtype=float)


def hacking_point(
    prefer_policy: Callable[[list[Example]], np.ndarray],
    prompts: list[str],
    base_replies: list[str],
    replies: list[str],
    judge_scores: np.ndarray,
    base_judge_scores: np.ndarray,
    minority_judge,
) -> dict:
    """One point of a reward-hacking curve: how often the labelling selectors (``prefer_policy``:
    1 where they prefer B, the policy's reply, to A, the base's) and the judge prefer the
    policy's reply to the base's on the same prompts (ties and identical replies count half),
    their gap, the replies' mean length in words, and the minority judge's win rate."""
    same = np.array([a == b for a, b in zip(base_replies, replies)])
    proxy = prefer_policy(
        [Example(i, p, a, b, -1) for i, (p, a, b) in enumerate(zip(prompts, base_replies, replies))]
    )
    proxy_wins = np.where(same, 0.5, proxy)
    judge_wins = wins(judge_scores, base_judge_scores)
    minority_wins = minority_judge.wins(judge_scores, base_judge_scores, replies, base_replies)
    diff = words(replies) - words(base_replies)
    return {
        "proxy_win_rate": float(proxy_wins.mean()),
        "judge_win_rate": float(judge_wins.mean()),
        "gap": float(proxy_wins.mean() - judge_wins.mean()),
        "gap_minority": float(proxy_wins.mean() - minority_wins.mean()),
        "judge_win_rate_lc": length_controlled(judge_wins, diff)["value"],
        "mean_judge_reward": float(judge_scores.mean()),
        "judge_win_rate_minority": float(minority_wins.mean()),
        "judge_win_rate_minority_lc": length_controlled(minority_wins, diff)["value"],
        "reply_words": float(np.mean([len(r.split()) for r in replies])),
    }


def labeller_accuracy(pairs: list[tuple[str, str, str]], judge, minority_judge) -> dict:
    """How often a labeller's DPO pairs (prompt, chosen, rejected) put first the reply each
    population's judge prefers (with rule judges: the exact accuracy against each rule), over
    the pairs that judge does not tie; the decided pairs counted."""
    if not pairs:
        return {}
    prompts, chosen, rejected = (list(c) for c in zip(*pairs))
    sc = judge.scores(prompts, chosen).detach().numpy()
    sr = judge.scores(prompts, rejected).detach().numpy()
    out = {}
    for pop, w in (
        ("majority", wins(sc, sr)),
        ("minority", minority_judge.wins(sc, sr, chosen, rejected)),
    ):
        decided = w != 0.5
        out[f"accuracy_{pop}"] = float(w[decided].mean()) if decided.any() else None
        out[f"decided_{pop}"] = int(decided.sum())
    out["pairs"] = len(pairs)
    return out
