"""The sweep comparison's statistics against hand computations, and its pairing by seed."""

import dataclasses
import json
import math
from functools import cache

import numpy as np
import pytest

from fedsim import comparison
from fedsim.comparison import Run, Settings, compare, flatten
from fedsim.config import compose

T_975_DF3 = 3.182446305284263  # Student t quantile, 0.975 with 3 degrees of freedom (tables)


@cache
def _configured() -> Settings:
    return Settings.of(compose().sweep)


def settings(**changes) -> Settings:
    """conf/config.yaml's sweep settings with ``changes``: the values a test does not set come
    from conf/, not from a second copy here."""
    return dataclasses.replace(_configured(), **changes)


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
    runs = _runs({s: {"sel.fedbis.acc": b, "sel.other.acc": b + 0.01 * (s + 1)} for s, b in enumerate(base)})
    paired = compare(runs, settings(baseline="fedbis"))["paired"]
    assert [p["metric"] for p in paired] == ["sel.other.acc"]
    p = paired[0]
    assert p["baseline"] == "sel.fedbis.acc" and p["per_seed"] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    half = T_975_DF3 * np.std([0.01, 0.02, 0.03, 0.04], ddof=1) / 2
    assert p["ci"] == pytest.approx([0.025 - half, 0.025 + half])
    assert p["p_value"] < 0.05


def test_paired_difference_against_a_swept_value_matches_seeds_across_runs():
    a = _runs({0: {"m": 1.0}, 1: {"m": 2.0}, 2: {"m": 4.0}}, w="uniform")
    b = _runs({0: {"m": 1.5}, 1: {"m": 2.0}, 2: {"m": 5.0}, 3: {"m": 9.0}}, w="data")  # seed 3 unpaired
    out = compare(a + b, settings(baseline="w=uniform"))
    assert [g["label"] for g in out["groups"]] == ["w=data", "w=uniform"]
    (p,) = out["paired"]
    assert p["label"] == "w=data - w=uniform" and p["seeds"] == [{"seed": "0"}, {"seed": "1"}, {"seed": "2"}]
    assert p["per_seed"] == pytest.approx([0.5, 0.0, 1.0])


def test_seed_keys_pool_replicates_and_other_keys_split_groups():
    runs = [Run("a", {"seed": "0", "task.split_seed": "0", "u": "3"}, {"m": 1.0}),
            Run("b", {"seed": "1", "task.split_seed": "1", "u": "3"}, {"m": 3.0}),
            Run("c", {"seed": "0", "task.split_seed": "0", "u": "5"}, {"m": 7.0})]
    groups = {g["label"]: g for g in compare(runs, settings())["groups"]}
    assert groups["u=3"]["metrics"]["m"]["mean"] == 2.0 and groups["u=3"]["runs"] == 2
    assert groups["u=5"]["metrics"]["m"]["ci"] is None  # one seed: no interval


def test_write_rebuilds_from_run_folders_with_metric_patterns(tmp_path):
    for seed, acc in enumerate([0.5, 0.7]):
        run = tmp_path / "machine-a" / f"seed={seed}"  # folders copied from elsewhere count alike
        run.mkdir(parents=True)
        point = {"overrides": [f"seed={seed}"], "swept": {"seed": str(seed)}}
        (run / comparison.POINT_FILE).write_text(json.dumps(point))
        (run / "results.json").write_text(json.dumps({"sel": {"a": {"acc": acc, "seconds": 9}, "b": {"acc": 0.5}}}))
    (tmp_path / "failed").mkdir()
    (tmp_path / "failed" / comparison.POINT_FILE).write_text(json.dumps({"overrides": [], "swept": {}}))
    result = comparison.write(tmp_path, settings(metrics=("sel.*.acc",), baseline="b"))
    assert set(result["groups"][0]["metrics"]) == {"sel.a.acc", "sel.b.acc"} and result["runs"] == 2
    assert result["paired"][0]["per_seed"] == pytest.approx([0.0, 0.2])
    summary = (tmp_path / "summary.md").read_text()
    assert "Student t interval" in summary and "sel.a.acc" in summary
    assert (tmp_path / "paired_differences.png").stat().st_size > 0


def test_runs_of_two_sweeps_with_other_constants_stay_apart_and_pair_by_seed(tmp_path):
    """Two sweeps over seeds, each with its own constant override, compared from their parent:
    the constant tells the groups apart, and the paired difference matches seeds across them."""
    for weights, accs in (("data_share", [0.5, 0.6, 0.7]), ("uniform", [0.55, 0.6, 0.8])):
        for seed, acc in enumerate(accs):
            run = tmp_path / weights / f"seed-{seed}"
            run.mkdir(parents=True)
            point = {"overrides": ["experiment=x", f"w={weights}", f"seed={seed}"], "swept": {"seed": str(seed)}}
            (run / comparison.POINT_FILE).write_text(json.dumps(point))
            (run / "results.json").write_text(json.dumps({"acc": acc}))
    result = comparison.write(tmp_path, settings(baseline="w=data_share"))
    assert [g["label"] for g in result["groups"]] == ["w=data_share", "w=uniform"]
    (p,) = result["paired"]
    assert p["label"] == "w=uniform - w=data_share" and p["per_seed"] == pytest.approx([0.05, 0.0, 0.1])
