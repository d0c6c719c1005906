"""The sweep comparison's statistics against hand computations, and its pairing by seed."""

import json
import math
import os
import re
import shutil
from functools import cache

import markdown
import numpy as np
import pytest
from omegaconf import DictConfig, OmegaConf
from scipy import stats as scipy_stats

from fedsim.config.compose import CONF_DIR
from fedsim.config.schema import Sweep, sweep_settings, typed_sweep
from fedsim.results import comparison, outputs, stats
from fedsim.results.comparison import Run, compare, flatten
from fedsim.run import cli

T_975_DF3 = 3.182446305284263  # Student t quantile, 0.975 with 3 degrees of freedom (tables)


@cache
def _configured() -> DictConfig:
    return OmegaConf.load(CONF_DIR / "config.yaml").sweep


def settings(**changes) -> Sweep:
    """conf/config.yaml's sweep settings (not an experiment's) with ``changes``, typed and checked as a
    run's are: the values a test does not set come from conf/, not from a second copy here."""
    return typed_sweep(_configured(), OmegaConf.create(changes))


def _runs(values_by_seed: dict[int, dict], **swept) -> list[Run]:
    return [Run(f"r{s}", {"seed": str(s), **swept}, v) for s, v in values_by_seed.items()]


def test_a_star_is_one_path_component_and_two_stars_any():
    one, any_ = comparison.path_pattern("sel.*.acc"), comparison.path_pattern("sel.**.acc")
    assert one.fullmatch("sel.fedbis.acc") and not one.fullmatch("sel.fedbis.each.0.acc")
    assert any_.fullmatch("sel.fedbis.each.0.acc") and not one.fullmatch("sel.acc")


def test_flatten_keeps_finite_numbers_by_path():
    flat = flatten({"a": {"b": 1, "c": [0.5, {"d": 2.0}], "e": "x", "f": True, "g": float("nan")}})
    assert flat == {"a.b": 1.0, "a.c.0": 0.5, "a.c.1.d": 2.0}


def test_flatten_refuses_a_key_with_a_dot_instead_of_dropping_its_metrics():
    with pytest.raises(ValueError, match="'fixed_alpha_0.5' contains '.'"):
        flatten({"methods": {"fixed_alpha_0.5": {"bleu1": 1.0}}})


def test_mean_std_and_t_interval_match_a_hand_computation():
    x = [0.50, 0.55, 0.60, 0.45]
    runs = _runs({s: {"acc": v} for s, v in enumerate(x)})
    d = compare(runs, settings())["groups"][0]["metrics"]["acc"]
    mean = sum(x) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in x) / 3)
    half = T_975_DF3 * std / math.sqrt(4)
    assert d["n"] == 4 and d["mean"] == pytest.approx(mean) and d["std"] == pytest.approx(std)
    assert d["ci"] == pytest.approx([mean - half, mean + half])


def test_bootstrap_interval_contains_the_mean_and_is_seeded():
    x = np.array([0.1, 0.3, 0.2, 0.5, 0.4, 0.35, 0.25, 0.15])
    s = settings(interval="bootstrap")
    lo, hi = comparison.interval(x, s)
    assert lo < x.mean() < hi and (lo, hi) == comparison.interval(x, s)


def test_paired_difference_against_a_method_in_the_same_run_pairs_by_seed():
    # the baseline is worse by a per-seed amount that the seed also moves: pairing removes it
    base = [0.50, 0.60, 0.40, 0.55]
    runs = _runs(
        {s: {"sel.fedbis.acc": b, "sel.other.acc": b + 0.01 * (s + 1)} for s, b in enumerate(base)}
    )
    paired = compare(runs, settings(baseline="fedbis"))["paired"]
    assert [p["metric"] for p in paired] == ["sel.other.acc"]
    p = paired[0]
    assert p["baseline"] == "sel.fedbis.acc" and p["per_seed"] == pytest.approx(
        [0.01, 0.02, 0.03, 0.04]
    )
    half = T_975_DF3 * np.std([0.01, 0.02, 0.03, 0.04], ddof=1) / 2
    assert p["ci"] == pytest.approx([0.025 - half, 0.025 + half])
    assert p["p_value"] < 0.05


def test_paired_difference_against_a_swept_value_matches_seeds_across_runs():
    a = _runs({0: {"m": 1.0}, 1: {"m": 2.0}, 2: {"m": 4.0}}, w="uniform")
    b = _runs(
        {0: {"m": 1.5}, 1: {"m": 2.0}, 2: {"m": 5.0}, 3: {"m": 9.0}}, w="data"
    )  # seed 3 unpaired
    out = compare(a + b, settings(baseline="w=uniform"))
    assert [g["label"] for g in out["groups"]] == ["w=data", "w=uniform"]
    (p,) = out["paired"]
    assert p["label"] == "w=data - w=uniform" and p["seeds"] == [
        {"seed": "0"},
        {"seed": "1"},
        {"seed": "2"},
    ]
    assert p["per_seed"] == pytest.approx([0.5, 0.0, 1.0])


def test_seed_keys_pool_replicates_and_other_keys_split_groups():
    runs = [
        Run("a", {"seed": "0", "task.split_seed": "0", "u": "3"}, {"m": 1.0}),
        Run("b", {"seed": "1", "task.split_seed": "1", "u": "3"}, {"m": 3.0}),
        Run("c", {"seed": "0", "task.split_seed": "0", "u": "5"}, {"m": 7.0}),
    ]
    groups = {g["label"]: g for g in compare(runs, settings())["groups"]}
    assert groups["u=3"]["metrics"]["m"]["mean"] == 2.0 and groups["u=3"]["runs"] == 2
    assert groups["u=5"]["metrics"]["m"]["ci"] is None  # one seed: no interval


def test_write_rebuilds_from_run_folders_with_metric_patterns(tmp_path):
    for seed, acc in enumerate([0.5, 0.7]):
        run = tmp_path / "machine-a" / f"seed={seed}"  # folders copied from elsewhere count alike
        run.mkdir(parents=True)
        point = {"overrides": [f"seed={seed}"], "swept": {"seed": str(seed)}}
        (run / comparison.POINT_FILE).write_text(json.dumps(point))
        (run / "results.json").write_text(
            json.dumps({"sel": {"a": {"acc": acc, "seconds": 9}, "b": {"acc": 0.5}}})
        )
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / comparison.POINT_FILE).write_text(
        json.dumps({"overrides": [], "swept": {}})
    )
    result, written = comparison.write(tmp_path, settings(metrics=("sel.*.acc",), baseline="b"))
    assert set(result["groups"][0]["metrics"]) == {"sel.a.acc", "sel.b.acc"} and result["runs"] == 2
    assert set(result["groups"][0]["bookkeeping"]) == {
        "sel.a.seconds"
    }  # its own section, never paired
    assert result["paired"][0]["per_seed"] == pytest.approx([0.0, 0.2])
    summary = written[0].read_text()
    assert "Student t interval" in summary and "sel.a.acc" in summary
    assert (tmp_path / "paired_differences.png").stat().st_size > 0


def test_a_run_that_failed_after_writing_its_results_is_not_compared(tmp_path):
    """A run whose privacy audit refuted its epsilon writes results.json, then error.txt: its
    numbers must not enter a comparison as if it had completed."""
    for seed in range(2):
        run = tmp_path / f"seed={seed}"
        run.mkdir()
        (run / comparison.POINT_FILE).write_text(
            json.dumps({"overrides": [f"seed={seed}"], "swept": {}})
        )
        (run / "results.json").write_text(json.dumps({"acc": 0.5 + seed}))
    (tmp_path / "seed=1" / "error.txt").write_text(
        "privacy audit: the reported epsilon does not hold"
    )
    assert [r.folder for r in comparison.load_runs(tmp_path)] == [str(tmp_path / "seed=0")]


def test_runs_of_two_sweeps_with_other_constants_stay_apart_and_pair_by_seed(tmp_path):
    """Two sweeps over seeds, each with its own constant override, compared from their parent:
    the constant tells the groups apart, and the paired difference matches seeds across them."""
    for weights, accs in (("data_share", [0.5, 0.6, 0.7]), ("uniform", [0.55, 0.6, 0.8])):
        for seed, acc in enumerate(accs):
            run = tmp_path / weights / f"seed-{seed}"
            run.mkdir(parents=True)
            point = {
                "overrides": ["experiment=x", f"w={weights}", f"seed={seed}"],
                "swept": {"seed": str(seed)},
            }
            (run / comparison.POINT_FILE).write_text(json.dumps(point))
            (run / "results.json").write_text(json.dumps({"acc": acc}))
    result, _ = comparison.write(tmp_path, settings(baseline="w=data_share"))
    assert [g["label"] for g in result["groups"]] == ["w=data_share", "w=uniform"]
    (p,) = result["paired"]
    assert p["label"] == "w=uniform - w=data_share" and p["per_seed"] == pytest.approx(
        [0.05, 0.0, 0.1]
    )


# ---- verdicts, power, zero spread (issue 38) ----------------------------------------------------


def _seed_runs(diffs: list[float], base: float = 0.5, **extra) -> list[Run]:
    """One run per seed, holding a method and the baseline whose paired difference is ``diffs``."""
    return _runs(
        {s: {"m.new.acc": base + d, "m.old.acc": base, **extra} for s, d in enumerate(diffs)}
    )


def _paired_row(diffs: list[float], **changes) -> dict:
    (row,) = compare(_seed_runs(diffs), settings(baseline="old", **changes))["paired"]
    return row


def _effect(size: float) -> tuple[dict, ...]:
    return ({"metric": "m.new.acc", "size": size, "source": "stated"},)


def test_the_three_verdicts_on_hand_computed_intervals():
    # diffs [-0.01, 0.01, 0, 0.02]: mean 0.005, sd 0.012910, t interval 0.005 -+ 3.1824 x 0.012910 / 2
    d = [-0.01, 0.01, 0.0, 0.02]
    half = T_975_DF3 * np.std(d, ddof=1) / 2
    assert half == pytest.approx(0.020543, abs=1e-6)
    row = _paired_row(d, effect_of_interest=_effect(0.05))
    assert row["ci"] == pytest.approx([0.005 - half, 0.005 + half])
    assert (row["verdict"], row["excludes_effect"]) == (
        "excluded",
        True,
    )  # 0.0255 < 0.05: the effect is ruled out
    assert (
        _paired_row(d, effect_of_interest=_effect(0.02))["verdict"] == "inconclusive"
    )  # 0.02 inside the CI
    assert (
        _paired_row(d, effect_of_interest=_effect(-0.05))["verdict"] == "excluded"
    )  # -0.0155 > -0.05
    assert _paired_row(d)["verdict"] == "inconclusive"  # no effect of interest: nothing to exclude
    shown = _paired_row([0.01, 0.02, 0.03, 0.04], effect_of_interest=_effect(0.05))
    assert (shown["verdict"], shown["excludes_effect"]) == (
        "shown",
        True,
    )  # CI [0.0045, 0.0455]: > 0, < 0.05


def test_an_effect_stated_against_one_baseline_is_not_judged_against_another():
    """ "FedE4RAG minus FedAvg: +0.062" excluded a difference against the vanilla model when a
    reader changed sweep.baseline: an effect names the baseline it was stated against."""
    d = [-0.01, 0.01, 0.0, 0.02]
    runs = _runs(
        {s: {"m.new.acc": 0.5 + x, "m.old.acc": 0.5, "m.vanilla.acc": 0.5} for s, x in enumerate(d)}
    )
    effect = ({"metric": "m.new.acc", "size": 0.05, "source": "paper", "baseline": "old"},)
    against = {
        b: next(
            r
            for r in compare(runs, settings(baseline=b, effect_of_interest=effect))["paired"]
            if r["metric"] == "m.new.acc"
        )
        for b in ("old", "vanilla")
    }
    assert (against["old"]["verdict"], against["old"]["effect"]["size"]) == ("excluded", 0.05)
    assert (against["vanilla"]["verdict"], against["vanilla"]["effect"]) == ("inconclusive", None)


def test_verdict_function_at_the_edges():
    assert (
        stats.verdict((0.001, 0.2), 0.5) == "shown"
        and stats.verdict((-0.2, -0.001), None) == "shown"
    )
    assert (
        stats.verdict((-0.1, 0.1), 0.1) == "inconclusive"
    )  # an effect on the CI's edge is not excluded
    assert stats.verdict((-0.1, 0.0999), 0.1) == "excluded" and stats.verdict(None, 0.1) is None


def _power(effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The exact power of a two-sided one-sample t-test (scipy's noncentral t), by hand."""
    tc = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
    nc = effect / sd * math.sqrt(n)
    return scipy_stats.nct.sf(tc, n - 1, nc) + scipy_stats.nct.cdf(-tc, n - 1, nc)


@pytest.mark.parametrize("n", [3, 8, 20])
def test_minimum_detectable_effect_has_the_power_asked_for(n):
    sd = 0.672
    mde = stats.detectable_effect(sd, n, level=0.95, power=0.8)
    assert _power(mde, sd, n) == pytest.approx(0.8, abs=1e-6)
    # the textbook approximation (t_{1-a/2,n-1} + t_{power,n-1}) s / sqrt(n) is close
    approx = (scipy_stats.t.ppf(0.975, n - 1) + scipy_stats.t.ppf(0.8, n - 1)) * sd / math.sqrt(n)
    assert mde == pytest.approx(approx, rel=0.06)
    assert (
        stats.detectable_effect(0.0, n, 0.95, 0.8) is None
        and stats.detectable_effect(sd, 1, 0.95, 0.8) is None
    )


@pytest.mark.parametrize(
    ("effect", "sd"), [(1.11, 0.672), (0.02, 0.0466), (0.062, 0.0024), (-0.5, 0.3)]
)
def test_seeds_needed_is_the_fewest_seeds_with_the_power(effect, sd):
    n = stats.seeds_needed(effect, sd, level=0.95, power=0.8)
    assert n >= 2 and _power(abs(effect), sd, n) >= 0.8
    assert n == 2 or _power(abs(effect), sd, n - 1) < 0.8


def test_a_paired_row_reports_its_mde_and_the_seeds_its_effect_needs():
    d = [-0.01, 0.01, 0.0, 0.02]
    row = _paired_row(d, effect_of_interest=_effect(0.02))
    sd = np.std(d, ddof=1)
    assert row["mde"] == pytest.approx(stats.detectable_effect(sd, 4, 0.95, 0.8))
    assert (
        row["seeds_needed"] == stats.seeds_needed(0.02, sd, 0.95, 0.8) and row["seeds_needed"] > 4
    )
    assert row["effect"] == {
        "metric": "m.new.acc",
        "size": 0.02,
        "source": "stated",
        "baseline": None,
    }  # as typed


FEDTP = {
    "routers": {"tfidf": {"overall": {"ehr": 0.6282}}, "fedmix": {"overall": {"ehr": 0.6167}}},
    "bootstrap_ci_ehr_gain": [-0.030, 0.002],
}
FEDTP_INTERVAL = (
    {
        "metric": "routers.*.overall.ehr",
        "baseline": "routers.tfidf.overall.ehr",
        "ci": "bootstrap_ci_ehr_gain",
        "method": "paired bootstrap over turns",
    },
)


def test_zero_spread_over_seeds_makes_no_claim():
    """Issue 38: two seeds that change nothing gave FedMix - TF-IDF -0.0115 [-0.0115, -0.0115],
    'CI excludes 0: True'. Without spread there is no interval over seeds and no verdict."""
    runs = _runs({s: flatten(FEDTP) for s in (0, 1)})
    out = compare(runs, settings(baseline="tfidf", metrics=("routers.*.overall.ehr",)))
    (row,) = out["paired"]
    assert row["per_seed"] == pytest.approx([-0.0115, -0.0115]) and row["constant"]
    assert (
        row["ci"] is None and row["verdict"] is None and "p_value" not in row and row["mde"] is None
    )
    assert row["basis"] == "every seed gives the same value; no claim over seeds"
    metric = out["groups"][0]["metrics"]["routers.fedmix.overall.ehr"]
    assert metric["ci"] is None and metric["constant"]
    text = comparison.summary_markdown(out)
    assert (
        "| no claim |" in text and "| shown" not in text
    )  # the row's verdict cell; the legend names every word


def test_zero_spread_falls_back_to_the_runs_own_interval_and_names_it():
    runs = _runs({s: flatten(FEDTP) for s in (0, 1)})
    out = compare(
        runs,
        settings(
            baseline="tfidf",
            metrics=("routers.*.overall.ehr",),
            run_intervals=FEDTP_INTERVAL,
            effect_of_interest=(
                {"metric": "routers.fedmix.overall.ehr", "size": 0.01, "source": "stated"},
            ),
        ),
    )
    (row,) = out["paired"]
    assert (
        row["ci"] == [-0.030, 0.002] and row["verdict"] == "excluded"
    )  # the run's CI includes 0, not +0.01
    assert row["basis"] == (
        "every seed gives the same value; the run's own paired bootstrap over turns "
        "(bootstrap_ci_ehr_gain, run r0)"
    )
    # normal approximation: SE = half-width / 1.96, MDE = (1.96 + 0.8416) SE
    assert row["mde"] == pytest.approx((1.959964 + 0.841621) * 0.016 / 1.959964, rel=1e-5)
    assert row["seeds_needed"] is None and "p_value" not in row  # more seeds would not move it


def test_a_run_interval_without_width_makes_no_claim_either():
    """A real 2-seed FedTP sweep on the test slice: FedMix routes every turn as TF-IDF does, so
    the run's own bootstrap over turns is [0, 0]: it excludes nothing."""
    same = {
        **FEDTP,
        "routers": {r: {"overall": {"ehr": 0.6988}} for r in ("tfidf", "fedmix")},
        "bootstrap_ci_ehr_gain": [0.0, 0.0],
    }
    out = compare(
        _runs({s: flatten(same) for s in (0, 1)}),
        settings(baseline="tfidf", run_intervals=FEDTP_INTERVAL, effect_of_interest=_effect(0.01)),
    )
    (row,) = out["paired"]
    assert row["ci"] is None and row["verdict"] is None and row["mde"] is None
    assert row["basis"].endswith("paired bootstrap over turns has no width either; no claim")


def test_a_run_interval_path_takes_the_metrics_wildcards_in_turn():
    results = {
        "h2h": {
            "u3": {"2": {"win": 0.55, "ci": [0.45, 0.65]}, "4": {"win": 0.6, "ci": [0.51, 0.7]}}
        }
    }
    runs = _runs({0: flatten(results)})
    entry = (
        {
            "metric": "h2h.*.*.win",
            "baseline": None,
            "ci": "h2h.*.*.ci",
            "method": "bootstrap over prompts",
        },
    )
    metrics = compare(runs, settings(metrics=("h2h.*.*.win",), run_intervals=entry))["groups"][0][
        "metrics"
    ]
    assert (
        metrics["h2h.u3.4.win"]["ci"] == [0.51, 0.7]
        and "run r0" in metrics["h2h.u3.4.win"]["basis"]
    )
    assert comparison._fill("a.*.b.**", ("x", "y.z")) == "a.x.b.y.z"


H2H = ({"metric": "h2h.*.win", "equal_at": 0.5},)


def test_a_contrast_is_judged_against_its_null_without_a_baseline():
    """Issue 40: a head-to-head win rate against FedBis had a CI over seeds and no verdict (no
    baseline pairs it: it is already a comparison). Its difference from 0.5 gets one, by hand."""
    wins = [0.36, 0.41, 0.33, 0.40]
    runs = _runs(
        {s: {"h2h.u3.win": w, "sel.fedbis.acc": 0.5, "sel.u3.acc": 0.6} for s, w in enumerate(wins)}
    )
    effect = ({"metric": "h2h.u3.win", "size": 0.05, "source": "stated", "baseline": "equal_at"},)
    (row,) = compare(runs, settings(contrasts=H2H, effect_of_interest=effect))["contrasts"]
    d = np.array(wins) - 0.5
    half = T_975_DF3 * np.std(d, ddof=1) / 2
    assert row["per_seed"] == pytest.approx(d.tolist())
    assert row["ci"] == pytest.approx([d.mean() - half, d.mean() + half])
    assert row["p_value"] == pytest.approx(scipy_stats.ttest_1samp(d, 0.0).pvalue)
    assert (row["verdict"], row["excludes_effect"], row["effect"]["size"]) == ("shown", True, 0.05)
    assert row["mde"] == pytest.approx(stats.detectable_effect(np.std(d, ddof=1), 4, 0.95, 0.8))
    assert "h2h.u3.win - 0.5" in comparison.summary_markdown(compare(runs, settings(contrasts=H2H)))
    assert "h2h.u3.win - 0.5" in comparison.plan(compare(runs, settings(contrasts=H2H)))
    # an effect stated against a baseline, or against any, is a difference from one, not from the null
    for baseline in ("fedbis", None):
        against = ({**effect[0], "baseline": baseline},)
        (row,) = compare(
            runs, settings(baseline="fedbis", contrasts=H2H, effect_of_interest=against)
        )["contrasts"]
        assert row["effect"] is None and row["verdict"] == "shown"
    assert compare(runs, settings())["contrasts"] == []  # not named: a headline metric, no verdict


def test_a_metric_both_paired_and_a_contrast_gets_each_its_own_effect():
    """A reward-hacking gap of FedBiscuit pairs with FedBis's and is a contrast (against 0): an
    effect meant for one must not judge the other."""
    runs = _runs(
        {s: {"gap.u3.1": 0.4 + 0.01 * s, "gap.fedbis.1": 0.3 + 0.02 * s} for s in range(4)}
    )
    effects = (
        {"metric": "gap.*.1", "size": 0.5, "source": "from the null", "baseline": "equal_at"},
        {"metric": "gap.*.1", "size": 0.2, "source": "u3 minus fedbis"},
    )
    out = compare(
        runs,
        settings(
            baseline="fedbis",
            contrasts=({"metric": "gap.*.*", "equal_at": 0.0},),
            effect_of_interest=effects,
        ),
    )
    (paired,) = out["paired"]
    assert paired["effect"]["size"] == 0.2 and {c["effect"]["size"] for c in out["contrasts"]} == {
        0.5
    }
    assert len(out["contrasts"]) == 2  # fedbis's own gap is a contrast too


def test_contrast_entries_that_disagree_are_refused_and_one_matching_nothing_is_named():
    runs = _runs({s: {"h2h.u3.reward_diff": 0.1 * s} for s in range(3)})
    both = (
        {"metric": "h2h.*.*", "equal_at": 0.5},
        {"metric": "h2h.*.reward_diff", "equal_at": 0.0},
    )
    with pytest.raises(comparison.ComparisonRefused, match=r"different equal_at \[0.0, 0.5\]"):
        compare(runs, settings(contrasts=both))
    typo = compare(runs, settings(contrasts=({"metric": "h2h.*.reward_dif", "equal_at": 0.0},)))
    assert typo["contrasts"] == []
    assert typo["warnings"] == [
        "sweep.contrasts pattern h2h.*.reward_dif matches no headline metric: no verdict for it"
    ]
    assert "**Warning: sweep.contrasts pattern h2h.*.reward_dif" in comparison.summary_markdown(
        typo
    )


def test_a_constant_contrast_falls_back_to_the_runs_own_interval_shifted_by_its_null():
    results = {"h2h": {"u3": {"win": 0.6, "ci": [0.51, 0.7]}}}
    entry = (
        {
            "metric": "h2h.*.win",
            "baseline": None,
            "ci": "h2h.*.ci",
            "method": "bootstrap over prompts",
        },
    )
    (row,) = compare(
        _runs({s: flatten(results) for s in (0, 1)}), settings(contrasts=H2H, run_intervals=entry)
    )["contrasts"]
    assert (
        row["ci"] == pytest.approx([0.01, 0.2])
        and row["verdict"] == "shown"
        and "run r0" in row["basis"]
    )


def test_an_experiments_contrasts_parse_as_numbers():
    """``null: 0.5`` as a YAML key is None, not the word: the field is ``equal_at``, and
    fedbiscuit_paper's contrasts reach the comparison as floats."""
    exp = OmegaConf.load(CONF_DIR / "experiment" / "fedbiscuit_paper.yaml")
    sweep = typed_sweep(OmegaConf.load(CONF_DIR / "config.yaml").sweep, exp.sweep)
    assert {c.metric: c.equal_at for c in sweep.contrasts}["rlhf.head_to_head.*.*.win_rate"] == 0.5


@pytest.mark.parametrize(
    "entry, named",
    [
        ("{metric: h2h.win}", r"contrasts\[0\]\.equal_at"),
        ("{equal_at: 0.5}", r"contrasts\[0\]\.metric"),
        ("{metric: h2h.win, equal_at: half}", "equal_at"),
        ("{metric: h2h.win, equal_at: 0.5, null: 0.5}", "None"),
        ("{metric: h2h.win, equal_at: 0.5, nul: 1}", "nul"),
    ],
)
def test_a_malformed_contrast_is_refused_naming_its_key(entry, named):
    """A contrast without its null, with a null that is not a number, or with a key the schema
    lacks (YAML's ``null:`` is the key None) is refused before any comparison, not read as 0."""
    with pytest.raises(ValueError, match=named):
        sweep_settings(
            OmegaConf.load(CONF_DIR / "config.yaml").sweep,
            OmegaConf.from_dotlist([f"contrasts=[{entry}]"]),
        )


def test_bootstrap_below_ten_seeds_is_warned():
    runs = _seed_runs([0.01, 0.03, 0.02, 0.05])
    assert compare(runs, settings(interval="bootstrap"))["warnings"]
    assert not compare(runs, settings())["warnings"]


def test_headline_families_lead_and_bookkeeping_stands_apart():
    """With sweep.metrics empty every number used to be a row of one table (FedTP: 171); now the
    headline is everything but bookkeeping, one table per family, and bookkeeping is apart."""
    values = {
        "m.new.acc": 0.6,
        "m.old.acc": 0.5,
        "m.new.f1": 0.3,
        "m.old.f1": 0.2,
        "faults.train.crashed": 0.0,
        "communication.fit.bytes": 10.0,
        "timings.total_s": 3.0,
        "m.new.seconds": 2,
    }
    runs = _runs({0: values, 1: {**values, "m.new.acc": 0.7}})
    out = compare(runs, settings(baseline="old"))
    assert out["families"] == {"acc": ["m.new.acc", "m.old.acc"], "f1": ["m.new.f1", "m.old.f1"]}
    assert set(out["bookkeeping"]) == {
        "faults.train.crashed",
        "communication.fit.bytes",
        "timings.total_s",
        "m.new.seconds",
    }
    assert {p["metric"] for p in out["paired"]} == {
        "m.new.acc",
        "m.new.f1",
    }  # bookkeeping is never paired
    text = comparison.summary_markdown(out)
    assert (
        text.index("## Verdicts")
        < text.index("### acc")
        < text.index("### f1")
        < text.index("## Appendix: bookkeeping")
    )
    appendix = text.split("## Appendix: bookkeeping")[1]
    assert "communication.fit.bytes" in appendix and "| CI |" not in appendix  # counts: no CI
    named = compare(runs, settings(baseline="old", metrics=("m.*.f1", "m.*.acc")))["families"]
    assert list(named) == ["m.*.f1", "m.*.acc"]  # the experiment's order


def test_a_wrong_metric_or_baseline_is_refused_naming_the_choices():
    runs = _seed_runs([0.01, 0.02]) + _runs({0: {"m.new.acc": 1.0, "m.old.acc": 1.0}}, w="u")
    with pytest.raises(
        comparison.ComparisonRefused, match=r"'m\.\*\.acx' matches no number.*m\.new\.acc"
    ):
        compare(runs, settings(metrics=("m.*.acx",)))
    with pytest.raises(
        comparison.ComparisonRefused, match="'odl' names no method.*methods: new, old.*w=u"
    ):
        compare(runs, settings(baseline="odl"))
    with pytest.raises(comparison.ComparisonRefused, match="does not take the value 'v'.*w=u"):
        compare(runs, settings(baseline="w=v"))


def test_an_experiments_own_pattern_for_a_phase_left_out_is_an_empty_family():
    runs = _seed_runs([0.01, 0.02])
    out = compare(runs, settings(metrics=("m.*.acc", "policy.*.win_rate")), strict=False)
    assert list(out["families"]) == ["m.*.acc"] and out["not_in_runs"] == ["policy.*.win_rate"]
    assert "hold no number for: policy.*.win_rate" in comparison.summary_markdown(out)


def test_plan_prints_the_seeds_each_difference_needs():
    d = [-0.01, 0.01, 0.0, 0.02]
    out = compare(_seed_runs(d), settings(baseline="old", effect_of_interest=_effect(0.02)))
    text = comparison.plan(out)
    sd = np.std(d, ddof=1)
    assert f"| {stats.seeds_needed(0.02, sd, 0.95, 0.8)} |" in text
    assert (
        f"| {stats.seeds_needed(0.005, sd, 0.95, 0.8)} |" in text
    )  # for the observed mean difference


def _sweep_folder(tmp_path, diffs) -> None:
    for run in _seed_runs(diffs):
        folder = tmp_path / run.folder
        folder.mkdir()
        (folder / comparison.POINT_FILE).write_text(
            json.dumps({"overrides": [f"seed={run.overrides['seed']}"]})
        )
        (folder / "results.json").write_text(
            json.dumps(
                {
                    "m": {
                        "new": {"acc": run.values["m.new.acc"]},
                        "old": {"acc": run.values["m.old.acc"]},
                    }
                }
            )
        )
        (folder / "config.yaml").write_text("{}\n")


def test_runs_stating_other_sweep_settings_are_named_unless_the_command_line_sets_them(
    tmp_path, capsys
):
    """Issue 40's sweep resumed across commits: seed 10's config stated the +6-point effect for
    every policy, seed 12's for FedBis and FedBiscuit only, and the comparison silently used seed 10's."""
    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    (tmp_path / "r2" / "config.yaml").write_text("sweep:\n  baseline: new\n  power: 0.9\n")
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=old"]) == 0
    err = capsys.readouterr().err
    assert (
        "warning: sweep.power differs in r2 from r0's, which this comparison uses (set sweep.power"
        in err
    )
    assert "sweep.baseline differs" not in err  # the command line chose it
    assert (
        cli.main(["compare", str(tmp_path), "sweep.baseline=old", "sweep.power=0.8", "--force"])
        == 0
    )
    assert "differs" not in capsys.readouterr().err
    # what counts is the setting in effect, of the runs the comparison counts
    (tmp_path / "r2" / "config.yaml").write_text("sweep:\n  contrasts: []\n")  # the default, stated
    (tmp_path / "r1" / "config.yaml").write_text("sweep:\n  power: 0.9\n")
    (tmp_path / "r1" / "error.txt").write_text("failed after its results")
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=old", "--force"]) == 0
    assert "differs" not in capsys.readouterr().err


def test_compare_refuses_before_writing_and_never_replaces_a_summary_silently(tmp_path, capsys):
    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=odl"]) == 2
    assert "methods: new, old" in capsys.readouterr().err and not list(tmp_path.glob("summary*"))
    assert cli.main(["compare", str(tmp_path), "sweep.metrics=[m.*.acx]"]) == 2 and not list(
        tmp_path.glob("*.json")
    )
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=old"]) == 0
    first = (tmp_path / "summary.md").read_text()
    assert "| shown |" in first
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=new"]) == 0
    assert (tmp_path / "summary.md").read_text() == first and (tmp_path / "summary-2.md").is_file()
    assert "summary-2.md" in capsys.readouterr().out
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=new", "--force"]) == 0
    assert (tmp_path / "summary.md").read_text() != first and not (
        tmp_path / "summary-3.md"
    ).exists()
    names = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert names == [
        "comparison-2.json",
        "comparison.json",
        "metrics-2.png",
        "metrics.png",
        "paired_differences-2.png",
        "paired_differences.png",
        "summary-2.md",
        "summary.md",
    ]
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=old", "--plan"]) == 0
    assert "seeds for it" in capsys.readouterr().out and not (tmp_path / "summary-3.md").exists()


def test_a_sweep_logs_paired_means_and_contrasts_to_mlflow_under_their_kind():
    from fedsim.run.sweep import _paired_means

    runs = _runs(
        {
            s: {"h2h.u3.win": 0.4 + 0.01 * s, "m.new.acc": 0.6, "m.old.acc": 0.5 + 0.01 * s}
            for s in range(3)
        }
    )
    logged = _paired_means(compare(runs, settings(baseline="old", contrasts=H2H)))
    assert logged == pytest.approx(
        {"paired/(all runs)/m.new.acc": 0.09, "contrast/(all runs)/h2h.u3.win": -0.09}
    )
    assert _paired_means(None) == {}


# ---- a record is input from someone else (issue 57) -------------------------------------------


@pytest.mark.parametrize("planted", ["summary.md", "r1/results.json", "r2"])
def test_compare_refuses_a_record_holding_a_link_before_reading_or_writing_it(
    planted, tmp_path, victim_home, capsys
):
    """The attack: a record shared as files (``cp -r`` and git keep links) holds a dangling
    ``summary.md`` link to ``~/.ssh/authorized_keys``, which ``fedsim compare`` created; or a
    run's results (or a whole run folder) linked to the user's files, which it read."""
    record = tmp_path / "record"
    record.mkdir()
    _sweep_folder(record, [0.01, 0.012, 0.011])
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(record / "r2", elsewhere)
    target = {
        "summary.md": victim_home / ".ssh" / "authorized_keys",
        "r1/results.json": elsewhere / "results.json",
        "r2": elsewhere,
    }[planted]
    if planted == "r2":
        shutil.rmtree(record / "r2")
    else:
        (record / planted).unlink(missing_ok=True)
    (record / planted).symlink_to(target)
    assert cli.main(["compare", str(record), "sweep.baseline=old"]) == 2
    assert f"{str(record / planted)!r} is a link" in capsys.readouterr().err
    assert not (victim_home / ".ssh" / "authorized_keys").exists() and not list(
        record.glob("comparison*")
    )


def test_compare_replaces_a_link_at_an_output_name_and_never_writes_through_it(
    tmp_path, victim_home
):
    """The ``--force`` rewrite of an earlier comparison went through a link at its name: an
    existing ``~/.bashrc`` was overwritten. Every output is a new file renamed over the name."""
    record, out = tmp_path / "record", tmp_path / "out"
    record.mkdir()
    out.mkdir()
    _sweep_folder(record, [0.01, 0.012, 0.011])
    for name in comparison.OUTPUTS:
        (out / name).symlink_to(
            victim_home / (".bashrc" if name == "summary.md" else f".ssh/{name}")
        )
    assert (
        cli.main(["compare", str(record), "sweep.baseline=old", "--output", str(out), "--force"])
        == 0
    )
    assert (victim_home / ".bashrc").read_text() == "# the user's own\n"
    assert sorted(p.name for p in victim_home.rglob("*")) == [".bashrc", ".ssh"]
    assert all((out / n).is_file() and not (out / n).is_symlink() for n in comparison.OUTPUTS)


def test_names_from_a_record_cannot_add_lines_or_columns_to_the_summary(tmp_path):
    """A metric name holding a newline put the attacker's line of its own into summary.md (as
    ``authorized_keys`` it is a key); ``|`` added table cells, an ANSI escape reached the terminal
    that shows the file. Control characters are escaped in every cell and heading."""
    planted = "x\nssh-ed25519 AAAAC3 attacker\r\x1b[2J\x85|"
    for w in ("a", f"a\n{planted}"):  # an override's value names a group
        for run in _seed_runs([0.01, 0.012, 0.011]):
            folder = tmp_path / "record" / f"{run.folder}-{len(w)}"
            folder.mkdir(parents=True)
            point = {"overrides": [f"seed={run.overrides['seed']}", f"w={w}"]}
            (folder / comparison.POINT_FILE).write_text(json.dumps(point))
            results = {
                "m": {
                    "new": {"acc": run.values["m.new.acc"], planted: 0.5},
                    "old": {"acc": run.values["m.old.acc"]},
                }
            }
            (folder / "results.json").write_text(json.dumps(results))
    comparison.write(tmp_path / "record", settings(baseline="old"), tmp_path / "out")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert not any(line.startswith("ssh-ed25519") for line in summary.splitlines())
    assert not any(c in summary for c in "\r\x1b\x85")
    assert "x\\nssh-ed25519 AAAAC3 attacker\\r\\x1b[2J\\x85\\|" in summary
    for table in (t for t in summary.split("\n\n") if t.startswith("|")):
        rows = table.splitlines()
        assert {len(re.findall(r"(?<!\\)\|", r)) for r in rows} == {
            len(re.findall(r"\|", rows[0]))
        }, table


def test_compare_refuses_a_record_or_an_output_folder_others_can_write(tmp_path, capsys):
    """Another local user who can write the record's folder or the comparison's could swap a
    file for a link between the check and the read or write: both are refused up front."""
    shared, own = tmp_path / "shared", tmp_path / "own"
    for folder in (shared / "record", own):
        folder.mkdir(parents=True)
        _sweep_folder(folder, [0.01, 0.012, 0.011])
    shared.chmod(0o777)
    assert (
        cli.main(["compare", str(own), "sweep.baseline=old", "--output", str(shared / "out")]) == 2
    )
    assert (
        f"{shared} is writable by others" in capsys.readouterr().err
        and not (shared / "out").exists()
    )
    assert (
        cli.main(
            ["compare", str(shared / "record"), "sweep.baseline=old", "--output", str(own / "out")]
        )
        == 2
    )
    assert (
        f"{shared} is writable by others" in capsys.readouterr().err and not (own / "out").exists()
    )
    assert cli.main(["compare", str(own), "sweep.baseline=old"]) == 0


def test_compare_refuses_a_record_named_through_a_folder_others_can_write(tmp_path, capsys):
    """The attack: the record is named through a link in a folder another user can write; its
    target (the user's own record) passed the check, and the link could be repointed to theirs
    before the read and the write. Checked as named and as resolved, then used resolved."""
    own, shared = tmp_path / "own", tmp_path / "shared"
    own.mkdir()
    _sweep_folder(own, [0.01, 0.012, 0.011])
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (shared / "record").symlink_to(own)
    assert (
        cli.main(
            [
                "compare",
                str(shared / "record"),
                "sweep.baseline=old",
                "--output",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert (
        f"{shared} is writable by others" in capsys.readouterr().err
        and not (tmp_path / "out").exists()
    )
    assert (
        cli.main(
            ["compare", str(own), "sweep.baseline=old", "--output", str(shared / "record" / "out")]
        )
        == 2
    )
    assert (
        f"{shared} is writable by others" in capsys.readouterr().err and not (own / "out").exists()
    )


def test_compare_refuses_a_record_with_a_folder_inside_that_others_can_write(tmp_path, capsys):
    """The attack: a record unpacked with its modes (``tar -p``, ``cp -a``) keeps a run folder
    0777; another local user swaps its results.json for a link or a FIFO after the walk and
    before the read. Every folder in the record is checked, not only the record's own."""
    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    for mode in (
        0o777,
        0o1777,
    ):  # sticky: another user's entry there stays theirs to swap for a link
        (tmp_path / "r1").chmod(mode)
        assert cli.main(["compare", str(tmp_path), "sweep.baseline=old"]) == 2
        assert f"{tmp_path / 'r1'} is writable by others" in capsys.readouterr().err
        assert not list(tmp_path.glob("summary*"))


@pytest.mark.parametrize(
    "planted",
    [
        "sparse results.json",
        "point.json a folder",
        "overrides not strings",
        "point.json a list",
        "nested results.json",
        "results.json not UTF-8",
        "yaml aliases",
        "config.yaml a list",
    ],
)
def test_a_records_file_that_is_no_runs_file_is_refused_naming_it(planted, tmp_path, capsys):
    """The attack: a record's files are read whole and trusted in shape. A 1 GiB sparse
    results.json (8 blocks on disk, kept sparse by ``cp``) took 2.3 GB of memory to read (10 GiB
    would take the machine); a point.json that is a folder or of another shape, or a results.json
    nested past the recursion limit, ended compare (and a sweep's final compare) in a traceback;
    a config.yaml of nested YAML aliases, a few hundred bytes, expands to billions of nodes in
    OmegaConf (here 2**13, which the old code took). Each is refused, naming the file."""
    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    run = tmp_path / "r1"
    if planted == "sparse results.json":
        with open(run / "results.json", "r+b") as fh:
            fh.truncate(outputs.MAX_FILE_BYTES + 1)
    elif planted == "point.json a folder":
        (run / comparison.POINT_FILE).unlink()
        (run / comparison.POINT_FILE).mkdir()
    elif planted in ("overrides not strings", "point.json a list"):
        (run / comparison.POINT_FILE).write_text(
            '{"overrides": [1]}' if planted.startswith("o") else "[]"
        )
    elif planted == "nested results.json":
        (run / "results.json").write_text("[" * 100_000 + "]" * 100_000)
    elif planted == "results.json not UTF-8":
        (run / "results.json").write_bytes(b'{"m": "\xff"}')
    elif planted == "config.yaml a list":
        (run / "config.yaml").write_text("- sweep\n")
    else:
        (run / "config.yaml").write_text(
            "a0: &a0 [x, x]\n"
            + "".join(f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, 13))
            + "sweep: {}\n"
        )
    name = (
        "config.yaml"
        if "yaml" in planted
        else "results.json"
        if "results" in planted
        else "point.json"
    )
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=old"]) == 2
    assert f"{str(run / name)!r}" in capsys.readouterr().err and not list(tmp_path.glob("summary*"))


def test_a_records_file_swapped_for_a_link_or_a_fifo_after_the_walk_is_not_read(tmp_path):
    """What a concurrent swap would leave at a name the walk found plain: a link is not
    followed, a FIFO is not waited on (its open would block until a writer came)."""
    (tmp_path / "results.json").symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    os.mkfifo(tmp_path / "point.json")
    with pytest.raises(comparison.ComparisonRefused, match="results.json' cannot be read"):
        comparison.read_record(tmp_path / "results.json")
    with pytest.raises(comparison.ComparisonRefused, match="point.json' is not a file"):
        comparison.read_record(tmp_path / "point.json")


def test_names_from_a_record_reach_the_terminal_escaped(tmp_path, capsys):
    """The attack: a record's names went to the terminal as they were, in compare's warnings and
    refusals: an ANSI escape in one clears the screen, retitles the window, or (some terminals)
    writes the clipboard. Control characters are printed as escapes, as in the summary."""
    ansi = "\x1b]0;owned\x07\x1b[2J"
    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    (tmp_path / "r0" / "config.yaml").write_text(
        json.dumps({"sweep": {"contrasts": [{"metric": f"m.{ansi}", "equal_at": 0.5}]}})
    )
    (tmp_path / "r1" / "results.json").write_text(
        json.dumps({"m": {"new": {"acc": 0.5}, "old": {"acc": 0.5}}, "x": {ansi: 1.0, "y": 1.0}})
    )
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=old"]) == 0
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=nomethod"]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    assert err.count("\\x1b]0;owned\\x07\\x1b[2J") == 2, (
        err
    )  # the warning, the refusal's list of methods


def test_names_from_a_record_add_no_table_cell_in_any_markdown_and_break_no_plot(tmp_path):
    """The attack: a name holding ``\\|`` became ``\\\\|``: an escaped backslash, then a cell's
    end for Python-Markdown (GitHub reads an escaped bar), so a column was added; a lone
    surrogate (``\\ud800`` in JSON, or a folder name that is not UTF-8) refused the whole
    comparison when the summary was encoded, and raised in the plots' font code; a name in
    mathtext (``$\\frac{$``) refused it after the summary was written. Backslashes are escaped
    too, surrogates shown, plot labels not parsed."""
    for w, name in (("a", "m\\|x"), ("b", "n\ud800"), ("c", "$\\frac{$")):
        for run in _seed_runs([0.01, 0.012, 0.011]):
            folder = tmp_path / "record" / f"{run.folder}-{w}"
            folder.mkdir(parents=True)
            (folder / comparison.POINT_FILE).write_text(
                json.dumps({"overrides": [f"seed={run.overrides['seed']}", f"w={w}\\|"]})
            )
            (folder / "results.json").write_text(
                json.dumps(
                    {
                        "m": {
                            "new": {name: run.values["m.new.acc"]},
                            "old": {name: run.values["m.old.acc"]},
                        }
                    }
                )
            )
            (folder / "config.yaml").write_text("{}\n")
    assert cli.main(["compare", str(tmp_path / "record"), "sweep.baseline=old"]) == 0
    summary = (tmp_path / "record" / "summary.md").read_text()
    assert "m\\\\\\|x" in summary and "n\\ud800" in summary
    assert all((tmp_path / "record" / n).is_file() for n in comparison.OUTPUTS)
    html = markdown.markdown(summary, extensions=["tables"])
    for table in re.findall(r"<table>.*?</table>", html, re.S):
        assert (
            len(
                {
                    row.count("<td") + row.count("<th")
                    for row in re.findall(r"<tr>.*?</tr>", table, re.S)
                }
            )
            == 1
        )


def test_a_folder_at_an_output_name_refuses_the_comparison_naming_it(tmp_path, capsys):
    """The attack: a record holding a folder named summary.md (or any output's name): ``--force``,
    which a sweep's final comparison always uses, ended in a traceback when the new file was
    renamed over it, summary.md and comparison.json written already."""
    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    (tmp_path / "metrics.png").mkdir()
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=old", "--force"]) == 2
    assert f"{tmp_path / 'metrics.png'} is a folder" in capsys.readouterr().err
    assert not list(tmp_path.glob("summary*"))


def test_a_record_nesting_folders_past_any_runs_depth_is_refused(tmp_path, capsys):
    """The attack: 1,100 nested folders in a record (2,200 characters of path, which git and
    ``cp -r`` keep) ended compare in a RecursionError traceback from the walk."""
    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    nested = [tmp_path.joinpath(*["a"] * depth) for depth in range(1, 1101)]
    for folder in nested:  # os.makedirs and shutil.rmtree recurse too
        folder.mkdir()
    try:
        assert cli.main(["compare", str(tmp_path), "sweep.baseline=old"]) == 2
        assert f"folders {comparison.MAX_DEPTH} deep at most" in capsys.readouterr().err
    finally:
        for folder in reversed(nested):
            folder.rmdir()


def test_a_records_fifo_hard_link_or_own_link_reaches_no_file_of_the_users(
    tmp_path, victim_home, capsys
):
    """Attacks that hold: a FIFO in a record (a reader would block) is refused before the read; a
    hard link at an output name (a tarball may carry one between its own members; a local user's
    to the victim's file) is replaced by the rename, not written through; a record named through
    a link is walked where the link leads, so the links there are found."""
    fifo, linked, own = tmp_path / "fifo", tmp_path / "linked", tmp_path / "own"
    for record in (fifo, linked, own):
        record.mkdir()
        _sweep_folder(record, [0.01, 0.012, 0.011])
    os.mkfifo(fifo / "r1" / "pipe")
    assert cli.main(["compare", str(fifo), "sweep.baseline=old"]) == 2
    assert "pipe' is neither a file nor a folder" in capsys.readouterr().err
    os.link(victim_home / ".bashrc", linked / "summary.md")
    assert cli.main(["compare", str(linked), "sweep.baseline=old", "--force"]) == 0
    assert (victim_home / ".bashrc").read_text() == "# the user's own\n"
    assert (linked / "summary.md").stat().st_nlink == 1
    (own / "summary.md").symlink_to(victim_home / ".ssh" / "authorized_keys")
    (tmp_path / "named").symlink_to(own)
    assert cli.main(["compare", str(tmp_path / "named"), "sweep.baseline=old"]) == 2
    assert "summary.md' is a link" in capsys.readouterr().err
    assert not (victim_home / ".ssh" / "authorized_keys").exists()


def test_an_interpolation_in_a_records_config_is_not_resolved_into_the_comparison(
    tmp_path, monkeypatch
):
    """An attack that holds: a record's config.yaml states ``sweep.metrics`` with
    ``${oc.env:SECRET_TOKEN}``; had it been resolved, the user's token would be listed in the
    summary ("patterns these runs hold no number for") and shared back with it."""
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    (tmp_path / "r0" / "config.yaml").write_text(
        "sweep:\n  metrics: ['m.**', '${oc.env:SECRET_TOKEN}']\n"
    )
    assert cli.main(["compare", str(tmp_path), "sweep.baseline=old"]) == 0
    assert not [p for p in tmp_path.iterdir() if p.is_file() and b"hunter2" in p.read_bytes()]


# ---- plans, looks and multiplicity (issue 58) -------------------------------------------------

DIFFS = {"a": [0.1, 0.11, 0.12, 0.1], "b": [0.01, 0.02, 0.03, 0.04], "c": [-0.01, 0.01, 0.0, 0.02]}


def _methods_runs() -> list[Run]:
    """Methods a, b, c against old over four seeds: p 0.0002, 0.030, 0.50 (t-tests by seed)."""
    base = [0.5, 0.6, 0.55, 0.52]
    return _runs(
        {
            s: {"m.old.acc": base[s], **{f"m.{k}.acc": base[s] + d[s] for k, d in DIFFS.items()}}
            for s in range(4)
        }
    )


def _plan(**changes) -> dict:
    return {
        "primary": ["m.b.acc"],
        "alpha": 0.05,
        "seeds": 8,
        "looks": [4, 8],
        "spending": "obrien_fleming",
        **changes,
    }


def test_without_a_plan_every_row_is_holm_adjusted_and_one_that_does_not_survive_reads_nominal():
    from statsmodels.stats.multitest import multipletests

    out = compare(_methods_runs(), settings(baseline="old"))
    rows = {p["metric"]: p for p in out["paired"]}
    raw = [scipy_stats.ttest_1samp(DIFFS[k], 0.0).pvalue for k in "abc"]
    assert [rows[f"m.{k}.acc"]["p_value"] for k in "abc"] == pytest.approx(raw)
    assert [rows[f"m.{k}.acc"]["p_holm"] for k in "abc"] == pytest.approx(
        multipletests(raw, method="holm")[1]
    )
    a, b, c = (rows[f"m.{k}.acc"] for k in "abc")
    assert (a["verdict"], b["verdict"], c["verdict"]) == ("shown", "nominal", "inconclusive")
    assert (
        b["nominal_verdict"] == "shown" and b["role"] == "secondary"
    )  # p 0.030 alone, 0.061 after Holm
    assert out["look"] is None and out["comparisons"] == {
        "primary": 0,
        "secondary": 3,
        "holm_alpha": 0.05,
    }
    text = comparison.summary_markdown(out)
    assert (
        "**No plan** (sweep.plan)" in text and "holds 3 comparisons: 0 primary, 3 secondary" in text
    )
    assert "| nominal (shown at the nominal level only) |" in text
    assert (
        "**nominal** (shown or excluded at the nominal level, not after Holm)" in text
    )  # the legend names it


def test_a_compare_before_the_planned_seeds_is_a_look_judged_at_its_boundary():
    out = compare(_methods_runs(), settings(baseline="old", plan=_plan()), earlier_looks=(2,))
    look = out["look"]
    z = stats.sequential_bounds([2 / 8, 4 / 8], 0.05, "obrien_fleming")[-1]
    assert look["status"] == "interim" and look["looks"] == [2, 4] and look["unplanned"] == [2]
    assert look["boundary_z"] == pytest.approx(z) and look["level"] == pytest.approx(
        1 - 2 * scipy_stats.norm.sf(z)
    )
    b = next(p for p in out["paired"] if p["metric"] == "m.b.acc")
    assert b["role"] == "primary" and b["ci"] == pytest.approx(
        stats.t_interval(DIFFS["b"], look["level"])
    )
    assert (
        b["verdict"] == "inconclusive"
    )  # p 0.030 is shown at the nominal level, not at the look's boundary
    assert out["comparisons"]["primary"] == 1 and "p_holm" not in b
    text = comparison.summary_markdown(out)
    assert "Look at 4 seeds (interim; seeds read at 2, 4 of 8 planned (unplanned: 2))" in text
    final = compare(_methods_runs(), settings(baseline="old", plan=_plan(seeds=4, looks=[4])))
    b = next(
        p for p in final["paired"] if p["metric"] == "m.b.acc"
    )  # one look at the planned seeds: nominal
    assert final["look"]["status"] == "final" and b["verdict"] == "shown"


def test_a_verdict_past_the_plan_says_so():
    out = compare(_methods_runs(), settings(baseline="old", plan=_plan(seeds=3, looks=[3])))
    assert out["look"]["status"] == "past the plan" and out["look"]["level"] is None
    assert "**Past the plan**: 4 seeds, 3 planned" in comparison.summary_markdown(out)


def test_compare_counts_each_look_in_the_manifest_and_refuses_another_plan(tmp_path, capsys):
    from fedsim.run.sweep import MANIFEST, plan_record

    _sweep_folder(tmp_path, [0.01, 0.012, 0.011])
    plan = "sweep.plan={primary: [m.new.acc], seeds: 6}"  # YAML and Hydra alike
    typed = _plan(primary=["m.new.acc"], seeds=6, looks=[6])
    (tmp_path / MANIFEST).write_text(
        json.dumps({"plan": plan_record(typed), "looks": [], "runs": []})
    )
    assert (
        cli.main(
            ["compare", str(tmp_path), "sweep.baseline=old", plan, "--output", str(tmp_path / "a")]
        )
        == 0
    )
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert [look["n"] for look in manifest["looks"]] == [3] and manifest["looks"][0][
        "status"
    ] == "interim"
    assert (
        cli.main(
            ["compare", str(tmp_path), "sweep.baseline=old", plan, "--output", str(tmp_path / "b")]
        )
        == 0
    )
    assert (
        len(json.loads((tmp_path / MANIFEST).read_text())["looks"]) == 1
    )  # the same seeds read again
    assert json.loads((tmp_path / "b" / "comparison.json").read_text())["look"]["looks"] == [3]
    capsys.readouterr()
    for other in ([plan, "sweep.plan.alpha=0.1"], []):  # changed, dropped
        assert (
            cli.main(
                [
                    "compare",
                    str(tmp_path),
                    "sweep.baseline=old",
                    *other,
                    "--output",
                    str(tmp_path / "c"),
                ]
            )
            == 2
        )
        assert "a plan cannot change once the sweep has run" in capsys.readouterr().err
    (tmp_path / MANIFEST).write_text(json.dumps({**manifest, "looks": [{"n": "3"}]}))
    assert (
        cli.main(
            ["compare", str(tmp_path), "sweep.baseline=old", plan, "--output", str(tmp_path / "c")]
        )
        == 2
    )
    assert "its looks are not a list" in capsys.readouterr().err
    manifest["plan"]["settings"]["alpha"] = 0.1  # edited, not rehashed
    (tmp_path / MANIFEST).write_text(json.dumps(manifest))
    assert (
        cli.main(
            ["compare", str(tmp_path), "sweep.baseline=old", plan, "--output", str(tmp_path / "c")]
        )
        == 2
    )
    assert (
        "does not match its own sha256" in capsys.readouterr().err and not (tmp_path / "c").exists()
    )
