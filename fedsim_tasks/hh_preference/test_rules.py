"""Rule-defined preferences (issue 63): the rules label as stated on hand-written replies, they
label the clients' and the test pairs (ties dropped), their relation to length on the real pairs
is what the docs report, and length-controlled win rates remove a pure length effect."""

from __future__ import annotations

import numpy as np
import pytest

from fedsim_tasks.hh_preference.dataset import Federation, Pair, load_pairs
from fedsim_tasks.hh_preference.rlhf import labeller_accuracy, length_controlled, win_rate, wins
from fedsim_tasks.hh_preference.rules import (
    AddressesUserRule,
    HarmlessnessRule,
    RuleJudge,
    rule_labels,
    rule_report,
)
from fedsim_tasks.hh_preference.settings import MinorityPreference
from fedsim_tasks.hh_preference.test_dataset import ROOT, task

HARMLESS, MINORITY = HarmlessnessRule(), AddressesUserRule()
RULES = {
    "majority": {"_target_": "fedsim_tasks.hh_preference.rules.HarmlessnessRule"},
    "minority": {"_target_": "fedsim_tasks.hh_preference.rules.AddressesUserRule"},
}


@pytest.mark.parametrize(
    "reply, score",
    [
        ("I'm sorry, I can't help with that.", 1),
        ("That is illegal and could get someone hurt.", 0),  # cautions and names harm
        ("Just stab him when he is asleep.", -1),
        ("You could steal it from the shop at night.", -1),
        ("Shut up, you idiot.", -1),
        ("The weather is nice today.", 0),
        ("Please talk to a doctor about the dose.", 1),
        ("Skills and killers.", -1),  # "killers" is harm (kill\w*), "skills" is not a match
    ],
)
def test_harmlessness_rule_scores_caution_up_and_harm_down(reply, score):
    assert HARMLESS.score(reply) == score


@pytest.mark.parametrize(
    "reply, score",
    [
        ("Paris is the capital. What else would you like to know?", 1),
        ("Paris is the capital. Why not visit?", 1),
        ("Paris is the capital. You could visit it in spring.", 1),
        ("Paris is the capital.", 0),
        ("Why? Because the river runs through it.", 0),  # a question, but not the last sentence
        ("Do you know? Paris is the capital.", 0),
        ("", 0),
        ("Is that yours", 1),  # no end mark: the last sentence still names the user
    ],
)
def test_addresses_user_rule_reads_the_last_sentence(reply, score):
    assert MINORITY.score(reply) == score


def test_a_rule_prefers_the_higher_score_and_ties_none():
    assert HARMLESS.prefers("Go punch him.", "I won't help with that.") == 1
    assert HARMLESS.prefers("I won't help with that.", "Go punch him.") == 0
    assert HARMLESS.prefers("Hello there.", "Nice day.") is None
    assert MINORITY.prefers("Sure.", "Sure. Anything else?") == 1


def test_rule_labels_drop_ties_and_flip_where_the_rule_prefers_hh_rejected():
    pairs = [
        Pair(0, "p", "I can't help with that.", "Shoot them."),  # rule agrees with HH
        Pair(1, "p", "Shoot them.", "I can't help with that."),  # rule prefers rejected
        Pair(2, "p", "Okay.", "Fine."),  # tie
    ]
    assert rule_labels(pairs, HARMLESS) == (frozenset({2}), frozenset({1}))


def test_rules_on_the_real_pairs_as_the_docs_report():
    """Measured on the 2,308 pairs (docs/methods/fedbiscuit.md): the minority's rule decides
    38% of them, picks the longer reply about half the time (its Wilson 95% interval holds 0.5)
    and agrees with the majority's rule about half the time where both decide; the majority's
    rule decides 27% and prefers the shorter reply (0.42)."""
    report = rule_report(load_pairs(ROOT), {"harmlessness": HARMLESS, "addresses_user": MINORITY})
    h, m = report["harmlessness"], report["addresses_user"]
    assert (h["decisive"], m["decisive"]) == (627, 876)
    lo, hi = m["prefers_longer_ci"]
    assert lo < 0.5 < hi and abs(m["prefers_longer"] - 0.503) < 0.001
    assert abs(h["prefers_longer"] - 0.420) < 0.001 and h["prefers_longer_ci"][1] < 0.5
    both = report["agreement"]["harmlessness/addresses_user"]
    assert both["both_decisive"] == 234 and abs(both["agree"] - 0.513) < 0.001


def test_rule_labels_reach_each_population_without_ties():
    fed = Federation(
        {**task(), "minority_preference": {**task()["minority_preference"], "kind": "rules"}}
        | {"rules": RULES},
        ROOT,
    )
    for partition in range(4):
        c = fed.client(partition)
        rule = MINORITY if c.minority else HARMLESS
        assert c.train and all(
            rule.prefers(e.a, e.b) == e.label for e in c.train + c.valid
        )  # every kept pair decided by its population's rule, none tied
    for population, rule in (("majority", HARMLESS), ("minority", MINORITY)):
        test = fed.test(population)
        assert test and all(rule.prefers(e.a, e.b) == e.label for e in test)
    ties = fed.ties()
    assert ties["majority"]["test"] + len(fed.test("majority")) // 2 == len(fed.splits["test"])
    assert 0 < ties["minority"]["pool"] < len(fed.splits["pool"])


def test_rules_kind_and_rules_block_go_together():
    from fedsim_tasks.hh_preference.settings import HHRLHFSettings

    base = dict(
        name="hh_rlhf",
        client="c",
        schema="s",
        data_root=None,
        unit="prompt",
        selector={},
        seed=0,
        max_pairs=None,
        splits={},
        split_seed=0,
        topic_model="m",
        n_topics=2,
        partitioner={},
        valid_share=0.2,
        minority_share=0.3,
        judge={},
    )
    rules = MinorityPreference(kind="rules", prefer="longer", weak_share=1.0)
    with pytest.raises(ValueError, match="kind=rules and task.rules go together"):
        HHRLHFSettings(**base, minority_preference=rules, rules=None)
    with pytest.raises(ValueError, match="must name a rule"):
        HHRLHFSettings(**base, minority_preference=rules, rules={"majority": RULES["majority"]})
    HHRLHFSettings(**base, minority_preference=rules, rules=RULES)


def test_rule_judged_win_rate_moves_when_the_replies_are_swapped():
    """The rule as the judge: a policy whose replies decline wins every prompt against a base
    that names harm; swap the two and it loses every prompt; make one reply the base's and it moves
    by half a prompt's share. The minority's rule judges its own way on the same replies."""
    policy = ["I'm sorry, I can't help with that.", "Please don't. Can I help otherwise?", "No."]
    base = ["Stab him.", "Steal it.", "No."]

    def rate(a, b):
        sa, sb = HARMLESS.scores([""] * 3, a).numpy(), HARMLESS.scores([""] * 3, b).numpy()
        return win_rate(wins(sa, sb), 100, 0, RuleJudge(MINORITY).wins(sa, sb, a, b))

    forward, swapped = rate(policy, base), rate(base, policy)
    assert forward["win_rate"] == pytest.approx(2.5 / 3) and swapped["win_rate"] == pytest.approx(
        0.5 / 3
    )
    assert forward["win_rate_minority"] == pytest.approx(2 / 3)  # only reply 2 asks back
    one = rate([base[0], *policy[1:]], base)
    assert one["win_rate"] == pytest.approx(forward["win_rate"] - 0.5 / 3)  # a win now a tie


def test_length_control_removes_a_pure_length_effect():
    """Wins that follow length alone (0.5 + 0.1 per word of difference) give a raw win rate of
    0.7 where the policy is mostly longer, and 0.5 at equal length; wins that ignore length keep
    their rate."""
    d = np.array([5.0] * 6 + [0.0] * 2 + [-5.0] * 2)
    by_length = 0.5 + 0.1 * d
    assert by_length.mean() == pytest.approx(0.7)
    lc = length_controlled(by_length, d)
    assert lc["value"] == pytest.approx(0.5) and lc["slope"] == pytest.approx(0.1)
    blind = np.array([1.0, 0.0] * 5)
    d2 = np.array([3.0, 3.0, -1.0, -1.0, 2.0, 2.0, 0.0, 0.0, 4.0, 4.0])
    assert length_controlled(blind, d2)["value"] == pytest.approx(0.5)
    out = win_rate(by_length, 100, 0, by_length, d)
    assert out["win_rate"] == pytest.approx(0.7) and out["win_rate_lc"] == pytest.approx(0.5)
    assert out["ci_lc"][0] <= 0.5 <= out["ci_lc"][1]
    same = length_controlled(np.array([1.0, 0.0, 1.0]), np.zeros(3))  # no slope to fit
    assert same["value"] == pytest.approx(2 / 3) and same["slope"] is None


def test_labeller_accuracy_is_exact_against_each_rule():
    pairs = [
        ("p", "I can't help with that. Anything else?", "Shoot them."),  # both rules agree
        ("p", "Shoot them.", "I won't do that."),  # majority: wrong; minority: tie
        ("p", "Hello. How are you?", "Hello."),  # majority: tie; minority: right
    ]
    acc = labeller_accuracy(pairs, HARMLESS, RuleJudge(MINORITY))
    assert acc == {
        "accuracy_majority": 0.5,
        "decided_majority": 2,
        "accuracy_minority": 1.0,
        "decided_minority": 2,
        "pairs": 3,
    }
