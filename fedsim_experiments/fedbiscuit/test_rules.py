"""FedBiscuit under rule-defined preferences (issue 63, ``experiment=fedbiscuit_rules``): the
rules are the judges, exact on each population's test pairs; selectors are scored on each
population's own decided test pairs; the policy phase's settings are checked before a run."""

from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from fedsim.config.compose import compose
from fedsim_experiments.fedbiscuit.protocol import evaluate_selectors
from fedsim_experiments.fedbiscuit.rlhf import judges, versus
from fedsim_experiments.fedbiscuit.settings import RLHF
from fedsim_tasks.hh_preference.dataset import Federation
from fedsim_tasks.hh_preference.rules import AddressesUserRule, HarmlessnessRule, RuleJudge
from fedsim_tasks.hh_preference.test_dataset import ROOT, task


@pytest.fixture(scope="module")
def ruled():
    cfg = compose(["experiment=fedbiscuit_rules"])
    spec = OmegaConf.to_container(cfg.task, resolve=True)
    return cfg, Federation(
        {**task(), **{k: spec[k] for k in ("rules", "minority_preference")}}, ROOT
    )


class Asker:
    """A selector that prefers the reply the minority's rule prefers (A on a tie); no weights."""

    def load(self, weights) -> None:
        pass

    def prob_b(self, examples) -> np.ndarray:
        rule = AddressesUserRule()
        return np.array([float(rule.score(e.b) > rule.score(e.a)) for e in examples])


def test_the_rules_judge_each_population_exactly(ruled):
    cfg, fed = ruled
    judge = HarmlessnessRule()
    minority, report = judges(judge, fed, cfg.task.minority_preference, Asker(), {})
    assert isinstance(minority, RuleJudge) and isinstance(minority.rule, AddressesUserRule)
    assert report["accuracy"] == 1.0 and report["accuracy_minority"] == 1.0
    assert report["minority_judge"] == "RuleJudge"


def test_selectors_are_scored_on_each_populations_decided_pairs(ruled):
    _, fed = ruled
    scores = evaluate_selectors(Asker(), [{}], fed, 0.5)
    assert scores["accuracy_minority"] == 1.0  # it is the minority's rule
    majority = fed.test("majority")
    expected = np.mean((Asker().prob_b(majority) > 0.5) == np.array([e.label for e in majority]))
    assert scores["accuracy_majority"] == pytest.approx(expected) and expected < 1.0


def test_versus_reports_length_controlled_rates_beside_the_raw():
    """A policy that asks back in every reply and is longer: the minority rule's raw win rate
    is 1; length-controlled it stays 1 (the wins do not follow the length difference); the
    raw policy against itself is 0.5 both ways."""
    rule = HarmlessnessRule()
    policy = ["Okay. What do you think?", "Sure thing, friend. Anything else?", "Yes. Why?"]
    base = ["Okay.", "Sure.", "Yes, it is true and it is fine."]
    p = (rule.scores([""] * 3, policy).numpy(), policy)
    b = (rule.scores([""] * 3, base).numpy(), base)
    out = versus(p, b, RuleJudge(AddressesUserRule()), 100, 0)
    assert out["win_rate"] == 0.5 and out["win_rate_minority"] == 1.0
    assert out["win_rate_minority_lc"] == pytest.approx(1.0) and out["win_rate_lc"] == 0.5
    same = versus(b, b, RuleJudge(AddressesUserRule()), 100, 0)
    assert same["win_rate_lc"] == same["win_rate_minority_lc"] == 0.5


def test_a_wrong_baseline_is_refused():
    cfg = OmegaConf.to_container(
        compose(["experiment=fedbiscuit_rules"]).protocol.rlhf, resolve=True
    )
    assert cfg["baselines"] == [] and RLHF(**cfg).baselines == []
    with pytest.raises(ValueError, match="baselines .* must be distinct of"):
        RLHF(**{**cfg, "baselines": ["fedsft"]})
