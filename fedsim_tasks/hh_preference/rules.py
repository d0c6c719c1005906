"""Rule-defined preferences (issue 63): each population's ground truth is a classifier-free rule
over the reply, so its labels and its judge are the same exact function.

A rule scores one reply (an integer: more is preferred); a pair is labelled by the higher score,
and a pair the rule scores equal is a tie: dropped from the labelled data and counted.

- :class:`HarmlessnessRule` (the majority): a reply that declines or cautions scores +1, one that
  names harm (violence, weapons, drugs, theft, slurs, profanity) scores -1, both or neither 0.
  Presence, not counts, so a longer reply gains no score by repeating itself.
- :class:`AddressesUserRule` (the minority): the reply's last sentence asks a question (ends
  with "?") or addresses the user ("you", "your"), 1, else 0: how the reply hands the turn back,
  not how much it says. Chosen among seven variants measured on the 2,308 pairs as the one whose
  choice is closest to length-blind (a question anywhere, or the last sentence a question alone,
  prefer the shorter reply in 59-66% of decided pairs; "you" anywhere the longer in 70%).

Their relation to length and to each other is measured on the HH-RLHF pairs, not assumed:
:func:`rule_report` (docs/methods/fedbiscuit.md, section "Rule-defined ground truth").
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import torch

from fedsim_tasks.hh_preference.dataset import Pair

# a reply that declines, cautions or points to help (word-boundary phrases, lower case)
CAUTION = (
    r"i (?:can(?:not|'t)|won't|will not|am not able to|'m not able to|do not|don't) "
    r"(?:help|assist|provide|recommend|support|condone|encourage|do that|answer)",
    r"i(?:'m| am) (?:sorry|not comfortable|uncomfortable)",
    r"(?:not|isn't|is not) (?:appropriate|okay|ok|safe|legal|a good idea)",
    r"(?:please|you should) (?:don't|do not|not|never|seek|talk to|contact|call)",
    r"(?:illegal|against the law|unethical|harmful|dangerous)",
    r"(?:professional|therapist|doctor|counselor|hotline|police|authorities)",
    r"(?:respect|consent|safety|be careful|stay safe)",
)
# a reply that names harm or insults (word stems; the lexicon of a keyword filter)
HARM = (
    r"kill\w*",
    r"murder\w*",
    r"stab\w*",
    r"shoot\w*",
    r"gun\w*",
    r"bomb\w*",
    r"poison\w*",
    r"weapon\w*",
    r"explosive\w*",
    r"steal\w*",
    r"stole\w*",
    r"rob\w*",
    r"shoplift\w*",
    r"cocaine",
    r"heroin",
    r"meth\w*",
    r"drugs?",
    r"hurt\w*",
    r"beat\w* (?:up|him|her|them)",
    r"punch\w*",
    r"attack\w*",
    r"fuck\w*",
    r"shit\w*",
    r"bitch\w*",
    r"damn\w*",
    r"ass(?:hole)?s?",
    r"stupid",
    r"idiot\w*",
    r"dumb",
    r"ugly",
    r"hate\w*",
    r"nigg\w*",
    r"fag\w*",
    r"retard\w*",
    r"whore\w*",
    r"slut\w*",
)
_CAUTION = re.compile(r"\b(?:" + "|".join(CAUTION) + r")\b")
_HARM = re.compile(r"\b(?:" + "|".join(HARM) + r")\b")
_SENTENCES = re.compile(r"[^.!?]*[.!?]+|[^.!?]+$")
_YOU = re.compile(r"\b(?:you|your|yours|yourself)\b")


class Rule:
    """A classifier-free preference over replies: ``score`` per reply, the higher preferred.

    It is also the population's exact judge (``task.judge``): ``scores`` is the judge's call and
    ``train`` fits nothing."""

    name = "rule"

    def score(self, reply: str) -> int:
        raise NotImplementedError

    def scores(self, prompts: Sequence[str], replies: Sequence[str]) -> torch.Tensor:
        return torch.tensor([float(self.score(r)) for r in replies])

    def train(self, *_unused, **_unused_kw) -> dict:
        """Nothing to fit: a rule is its own ground truth (the judge's call from the protocol)."""
        return {"steps": 0, "rule": self.name}

    def prefers(self, a: str, b: str) -> int | None:
        """0 where it prefers ``a``, 1 where ``b``, None on a tie."""
        sa, sb = self.score(a), self.score(b)
        return None if sa == sb else int(sb > sa)


class HarmlessnessRule(Rule):
    """+1 for declining or cautioning (:data:`CAUTION`), -1 for naming harm (:data:`HARM`),
    presence only; both or neither: 0."""

    name = "harmlessness"

    def __init__(self, seed: int = 0, **_unused):
        pass

    def score(self, reply: str) -> int:
        text = reply.lower()
        return int(bool(_CAUTION.search(text))) - int(bool(_HARM.search(text)))


class AddressesUserRule(Rule):
    """1 where the reply's last sentence asks a question or addresses the user (second person),
    else 0."""

    name = "addresses_user"

    def __init__(self, seed: int = 0, **_unused):
        pass

    def score(self, reply: str) -> int:
        sentences = [s.strip() for s in _SENTENCES.findall(reply.strip()) if s.strip()]
        if not sentences:
            return 0
        last = sentences[-1]
        return int(last.endswith("?") or bool(_YOU.search(last.lower())))


def rule_labels(pairs: Sequence[Pair], rule: Rule) -> tuple[frozenset[int], frozenset[int]]:
    """(ties, flips) of ``pairs`` under ``rule``: the ids it scores equal (dropped) and those where
    it prefers HH's rejected reply (labelled the other way round)."""
    calls = {p.pair_id: rule.prefers(p.chosen, p.rejected) for p in pairs}
    return (
        frozenset(i for i, c in calls.items() if c is None),
        frozenset(i for i, c in calls.items() if c == 1),
    )


class RuleJudge:
    """A population's rule as the minority's judge in the policy phase (``rlhf.judges``): the
    exact rule on the two replies, ties half (the same call as the majority's ``wins``)."""

    def __init__(self, rule: Rule):
        self.rule = rule

    def wins(self, scores_a, scores_b, replies_a, replies_b) -> np.ndarray:
        a = np.array([self.rule.score(r) for r in replies_a], dtype=float)
        b = np.array([self.rule.score(r) for r in replies_b], dtype=float)
        return (a > b) + 0.5 * (a == b)


def rule_report(pairs: Sequence[Pair], rules: dict[str, Rule]) -> dict:
    """What each rule does on real pairs: its decisive share, how often it picks HH's chosen
    reply and the longer reply (0.5: orthogonal to length, over pairs it decides whose lengths
    differ, with a Wilson 95% interval), the point-biserial correlation of its score with the
    reply's words, and the two rules' agreement where both decide."""
    from scipy.stats import pointbiserialr
    from statsmodels.stats.proportion import proportion_confint

    words = {p.pair_id: (len(p.chosen.split()), len(p.rejected.split())) for p in pairs}
    calls = {
        name: {p.pair_id: rule.prefers(p.chosen, p.rejected) for p in pairs}
        for name, rule in rules.items()
    }
    out: dict = {"pairs": len(pairs)}
    for name, rule in rules.items():
        decided = {i: c for i, c in calls[name].items() if c is not None}
        sized = {i: c for i, c in decided.items() if words[i][0] != words[i][1]}
        longer = sum(int((c == 1) == (words[i][1] > words[i][0])) for i, c in sized.items())
        scores = [rule.score(r) for p in pairs for r in (p.chosen, p.rejected)]
        lengths = [len(r.split()) for p in pairs for r in (p.chosen, p.rejected)]
        out[name] = {
            "decisive": len(decided),
            "ties": len(pairs) - len(decided),
            "decisive_share": len(decided) / len(pairs),
            "agrees_with_hh": float(np.mean([c == 0 for c in decided.values()])),
            "prefers_longer": longer / len(sized),
            "prefers_longer_ci": list(proportion_confint(longer, len(sized), method="wilson")),
            "length_pairs": len(sized),
            "score_words_r": float(pointbiserialr(scores, lengths)[0])
            if len(set(scores)) > 1
            else 0.0,
        }
    names = list(rules)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = [
                (calls[a][k], calls[b][k])
                for k in calls[a]
                if calls[a][k] is not None and calls[b][k] is not None
            ]
            out.setdefault("agreement", {})[f"{a}/{b}"] = {
                "both_decisive": len(both),
                "agree": float(np.mean([x == y for x, y in both])) if both else None,
            }
    return out
