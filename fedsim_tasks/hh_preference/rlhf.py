"""The RLHF phase's data plumbing (METHODS.md section 4): policy prompts from HH dialogues,
completion pairs labelled by selectors, the base policy's dialogue data, and win rates.

The base policy is first taught to answer (SFT) on Synthetic-Persona-Chat, general chit-chat
that holds no HH preference, so whatever preference the aligned policies show comes from the
selectors' labels (or, for the baselines, the clients' pairs).
"""

from __future__ import annotations

from collections.abc import Callable
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
        rest = rest[head[0] + len(head[1]):]
        nxt = [i for i in (rest.find(HUMAN), rest.find(ASSISTANT)) if i >= 0]
        text, rest = (rest[:min(nxt)], rest[min(nxt):]) if nxt else (rest, "")
        turns.append((markers[head[1]], text.strip()))
    return turns[:-1] if turns and turns[-1] == ("Assistant", "") else turns


def policy_prompt(prompt: str, sep: str, context_turns: int) -> str:
    """The policy's input for an HH prompt: its last ``context_turns`` turns, ending with the
    Assistant cue."""
    return format_prompt(hh_turns(prompt)[-context_turns:], sep)


def persona_chat_examples(data_root: str, split: str, sep: str, context_turns: int) -> list[tuple[str, str]]:
    """(prompt, reply) for every User 2 turn of Synthetic-Persona-Chat ``split``, User 1 as the
    Human and User 2 as the Assistant, with up to ``context_turns`` turns of context (no persona)."""
    return [(e.prompt, e.reply) for e in examples(persona_chat(data_root, split), sep, context_turns, 0, ["User 2"])]


def completion_pairs(prompts: list[str], completions: list[list[str]],
                     prefer_b: Callable[[list[Example]], np.ndarray]) -> list[tuple[str, str, str]]:
    """Every pair of distinct completions of each prompt, labelled by ``prefer_b`` (1: B preferred),
    as DPO's (prompt index, chosen, rejected) with the HH prompt kept by index in ``prompts``."""
    examples = [Example(i, prompts[i], a, b, -1) for i, outs in enumerate(completions)
                for a, b in combinations(dict.fromkeys(outs), 2) if a.strip() and b.strip()]
    if not examples:
        return []
    labels = prefer_b(examples)
    return [(prompts[e.pair_id], e.b, e.a) if y else (prompts[e.pair_id], e.a, e.b)
            for e, y in zip(examples, labels)]


def win_rate(scores_a: np.ndarray, scores_b: np.ndarray, resamples: int, seed: int,
             minority_reversed: bool = True) -> dict:
    """How often reply A beats reply B on the same prompt (ties count half), with a paired
    bootstrap 95% CI over prompts; and, where the minority's preference is HH's reversed
    (``minority_reversed``), the same for the minority, whose judge is then the reverse of this
    one (1 - the win rate). No judge of a second-criterion minority exists: no minority rate."""
    wins = (scores_a > scores_b) + 0.5 * (scores_a == scores_b)
    lo, hi = paired_bootstrap_ci(wins, resamples, seed)
    out = {"win_rate": float(wins.mean()), "ci": [lo, hi], "prompts": int(wins.size)}
    if minority_reversed:
        out |= {"win_rate_minority": float(1 - wins.mean()), "ci_minority": [1 - hi, 1 - lo]}
    return out


def hacking_point(prefer_policy: Callable[[list[Example]], np.ndarray], prompts: list[str], base_replies: list[str],
                  replies: list[str], judge_scores: np.ndarray, base_judge_scores: np.ndarray) -> dict:
    """One point of a reward-hacking curve: how often the labelling selectors (``prefer_policy``:
    1 where they prefer B, the policy's reply, to A, the base's) and the judge prefer the
    policy's reply to the base's on the same prompts (ties and identical replies count half),
    their gap, and the replies' mean length in words."""
    same = np.array([a == b for a, b in zip(base_replies, replies)])
    proxy = prefer_policy([Example(i, p, a, b, -1) for i, (p, a, b) in enumerate(zip(prompts, base_replies, replies))])
    proxy_wins = np.where(same, 0.5, proxy)
    judge_wins = (judge_scores > base_judge_scores) + 0.5 * (judge_scores == base_judge_scores)
    return {"proxy_win_rate": float(proxy_wins.mean()), "judge_win_rate": float(judge_wins.mean()),
            "gap": float(proxy_wins.mean() - judge_wins.mean()), "mean_judge_reward": float(judge_scores.mean()),
            "reply_words": float(np.mean([len(r.split()) for r in replies]))}
