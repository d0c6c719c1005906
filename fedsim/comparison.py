"""A sweep's comparison: every metric over seeds (mean, spread, CI) and paired differences
against a baseline, from the run folders alone (``fedsim compare <folder>``).

Runs are grouped by their overrides minus the seed keys (``sweep.seed_keys``); a group's runs
are replicates. A baseline is either a method name that appears as one component of a
results.json path (``selectors.fedbis.accuracy`` is the baseline of
``selectors.fedbiscuit_u3.accuracy``: the same run, so the same seed) or ``KEY=VALUE`` of a swept
override (the run with that value and otherwise the same overrides and seeds). Differences are
paired by seed: the per-seed difference removes what the seed moves in both.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf
from scipy import stats

from fedsim.results import RunOutput, markdown_table

POINT_FILE = "point.json"  # a sweep run's overrides, beside its results.json


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What ``sweep`` in the config says (``fedsim/schema.py`` ``Sweep``)."""
    seed_keys: tuple[str, ...]
    baseline: str | None
    metrics: tuple[str, ...]
    interval: str
    level: float

    @classmethod
    def of(cls, sweep) -> Settings:
        """From a composed config's ``sweep`` block."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in OmegaConf.to_container(sweep).items()})


@dataclass(frozen=True)
class Run:
    """One completed run: its overrides (key -> value; every override of the run, so runs of
    sweeps with other constant overrides stay apart) and the numbers of its results.json."""
    folder: str
    overrides: dict[str, str]
    values: dict[str, float]


def flatten(results, prefix: str = "") -> dict[str, float]:
    """Every finite number of a results.json, by dotted path (list items by index)."""
    if isinstance(results, bool):
        return {}
    if isinstance(results, (int, float)):
        return {prefix: float(results)} if math.isfinite(results) else {}
    items = results.items() if isinstance(results, dict) else \
        enumerate(results) if isinstance(results, list) else ()
    out = {}
    for key, value in items:
        if "." in str(key):
            raise ValueError(f"results key {prefix + '.' if prefix else ''}{key!r} contains '.': its dotted path "
                             "would be ambiguous and no metric pattern could name it")
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def path_pattern(pattern: str) -> re.Pattern:
    """A results path pattern: ``*`` is one dotted component (``selectors.*.accuracy`` is every
    method's, not each selector's ``selectors.m.each.0.accuracy``), ``**`` any number of them."""
    parts = [".+" if p == "**" else "[^.]*".join(map(re.escape, p.split("*"))) for p in pattern.split(".")]
    return re.compile(r"\.".join(parts))


def load_runs(folder: str | Path, patterns: tuple[str, ...] = ()) -> list[Run]:
    """Every run under ``folder`` that has a ``point.json`` and a ``results.json`` (runs copied
    in from other machines count alike), with the metrics that match ``patterns``."""
    runs = []
    for point in sorted(Path(folder).rglob(POINT_FILE)):
        results = point.parent / "results.json"
        if not results.is_file():
            continue
        values = flatten(json.loads(results.read_text()))
        if patterns:
            wanted = [path_pattern(p) for p in patterns]
            values = {k: v for k, v in values.items() if any(w.fullmatch(k) for w in wanted)}
        overrides = json.loads(point.read_text())["overrides"]
        runs.append(Run(str(point.parent), dict(o.partition("=")[::2] for o in overrides), values))
    return runs


def interval(x: np.ndarray, settings: Settings, seed: int = 0) -> tuple[float, float] | None:
    """CI of the mean of ``x`` (one value per seed): Student t, or scipy's BCa bootstrap. None
    with fewer than two values; a zero spread gives the point itself."""
    x = np.asarray(x, float)
    if x.size < 2:
        return None
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    if settings.interval == "t":
        lo, hi = stats.t.interval(settings.level, x.size - 1, loc=x.mean(), scale=stats.sem(x))
    else:
        res = stats.bootstrap((x,), np.mean, confidence_level=settings.level, method="BCa",
                              n_resamples=9999, rng=np.random.default_rng(seed))
        lo, hi = res.confidence_interval
    return float(lo), float(hi)


def describe(x: np.ndarray, settings: Settings) -> dict:
    x = np.asarray(x, float)
    ci = interval(x, settings)
    return {"n": int(x.size), "mean": float(x.mean()), "std": float(x.std(ddof=1)) if x.size > 1 else None,
            "ci": list(ci) if ci else None}


def _group_key(run: Run, seed_keys: tuple[str, ...]) -> tuple:
    return tuple(sorted((k, v) for k, v in run.overrides.items() if k not in seed_keys))


def _seed_of(run: Run, seed_keys: tuple[str, ...]) -> tuple:
    return tuple(sorted((k, v) for k, v in run.overrides.items() if k in seed_keys))


def _label(group: tuple, varying: set[str]) -> str:
    """The group's overrides that differ between the compared runs (the rest is common)."""
    return " ".join(f"{k}={v}" for k, v in group if k in varying) or "(all runs)"


def _varying(runs: list[Run], seed_keys: tuple[str, ...]) -> set[str]:
    keys = {k for r in runs for k in r.overrides if k not in seed_keys}
    return {k for k in keys if len({r.overrides.get(k) for r in runs}) > 1}


def _baseline_path(path: str, name: str, known: set[str]) -> str | None:
    """``path`` with one component replaced by ``name``, if that path exists (and differs)."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        candidate = ".".join([*parts[:i], name, *parts[i + 1:]])
        if part != name and candidate in known:
            return candidate
    return None


def _paired(diffs: dict[tuple, float], settings: Settings) -> dict:
    seeds = sorted(diffs)
    d = np.array([diffs[s] for s in seeds])
    out = {"seeds": [dict(s) for s in seeds], "per_seed": d.tolist(), **describe(d, settings)}
    if d.size > 1 and np.ptp(d) > 0:
        out["p_value"] = float(stats.ttest_1samp(d, 0.0).pvalue)
    return out


def compare(runs: list[Run], settings: Settings) -> dict:
    """Per group and metric: mean, std and CI over seeds; per baseline pair: the paired
    difference per seed and its CI."""
    by_group: dict[tuple, dict[tuple, Run]] = {}
    for run in runs:
        by_group.setdefault(_group_key(run, settings.seed_keys), {})[_seed_of(run, settings.seed_keys)] = run
    varying = _varying(runs, settings.seed_keys)
    groups = []
    for group, by_seed in sorted(by_group.items()):
        metrics = sorted({k for r in by_seed.values() for k in r.values})
        groups.append({"group": {k: v for k, v in group if k in varying}, "label": _label(group, varying),
                       "runs": len(by_seed), "metrics": {
            m: describe([r.values[m] for r in by_seed.values() if m in r.values], settings) for m in metrics}})
    return {"settings": {"seed_keys": list(settings.seed_keys), "baseline": settings.baseline,
                         "interval": settings.interval, "level": settings.level},
            "runs": len(runs), "groups": groups, "paired": _paired_all(by_group, settings, varying)}


def _paired_all(by_group: dict[tuple, dict[tuple, Run]], settings: Settings, varying: set[str]) -> list[dict]:
    if not settings.baseline:
        return []
    key, sep, value = settings.baseline.partition("=")
    rows = []
    for group, by_seed in sorted(by_group.items()):
        if sep:  # a swept override's value: the same group with KEY=VALUE, seed by seed
            base_group = tuple(sorted({**dict(group), key: value}.items()))
            if base_group == group or base_group not in by_group or key not in dict(group):
                continue
            base = by_group[base_group]
            metrics = sorted({k for r in by_seed.values() for k in r.values})
            pairs = {m: (m, {s: r.values[m] - base[s].values[m] for s, r in by_seed.items()
                             if s in base and m in r.values and m in base[s].values}) for m in metrics}
            label = f"{_label(group, varying)} - {settings.baseline}"
        else:  # a method inside each run: the same run's path with the baseline's name
            known = {k for r in by_seed.values() for k in r.values}
            pairs = {}
            for m in sorted(known):
                b = _baseline_path(m, settings.baseline, known)
                if b:
                    pairs[m] = (b, {s: r.values[m] - r.values[b] for s, r in by_seed.items()
                                    if m in r.values and b in r.values})
            label = _label(group, varying)
        common = {"group": {k: v for k, v in group if k in varying}, "label": label}
        rows += [{**common, "metric": m, "baseline": b, **_paired(d, settings)} for m, (b, d) in pairs.items() if d]
    return rows


def _ci_text(ci) -> str:
    return "" if ci is None else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def summary_markdown(comparison: dict) -> str:
    s = comparison["settings"]
    how = ("Student t interval over seeds" if s["interval"] == "t" else "BCa bootstrap over seeds (scipy)")
    rows = [{"group": g["label"], "metric": m, "n": d["n"], "mean": d["mean"],
             "std": d["std"] if d["std"] is not None else "", "CI": _ci_text(d["ci"])}
            for g in comparison["groups"] for m, d in g["metrics"].items()]
    text = (f"# Sweep comparison\n\n{comparison['runs']} completed runs; replicates: "
            f"{', '.join(s['seed_keys'])}; {int(s['level'] * 100)}% CI: {how}.\n\n## Metrics over seeds\n"
            + markdown_table(rows, ["group", "metric", "n", "mean", "std", "CI"]) + "\n")
    if comparison["paired"]:
        paired = [{"group": p["label"], "metric": p["metric"], "baseline": p["baseline"], "n": p["n"],
                   "mean diff": p["mean"], "CI": _ci_text(p["ci"]), "p (t)": p.get("p_value", ""),
                   "CI excludes 0": "" if p["ci"] is None else str(not p["ci"][0] <= 0.0 <= p["ci"][1])}
                  for p in comparison["paired"]]
        text += (f"\n## Paired difference against the baseline ({s['baseline']}), per seed\n"
                 + markdown_table(paired, ["group", "metric", "baseline", "n", "mean diff", "CI", "p (t)",
                                           "CI excludes 0"]) + "\n")
    return text


def plot_paired(comparison: dict, out: RunOutput) -> None:
    """A forest plot: each paired difference with its CI, zero marked."""
    rows = [p for p in comparison["paired"] if p["ci"] is not None]
    if not rows:
        return
    fig, ax, save = out.figure("paired_differences")
    fig.set_size_inches(7, 0.9 + 0.28 * len(rows))
    y = np.arange(len(rows))[::-1]
    means = np.array([p["mean"] for p in rows])
    lo, hi = np.array([p["ci"][0] for p in rows]), np.array([p["ci"][1] for p in rows])
    ax.errorbar(means, y, xerr=[means - lo, hi - means], fmt="o", capsize=3)
    ax.axvline(0.0, color="grey", lw=0.8, ls="--")
    ax.set_yticks(y, [f"{p['label']} {p['metric']}" for p in rows], fontsize=6)
    ax.set_xlabel(f"paired difference against {comparison['settings']['baseline']} "
                  f"({int(comparison['settings']['level'] * 100)}% CI)")
    save()


def write(folder: str | Path, settings: Settings, output: str | Path | None = None) -> dict:
    """Compare the runs under ``folder`` and write ``comparison.json``, ``summary.md`` and
    ``paired_differences.png`` to ``output`` (default: ``folder``)."""
    runs = load_runs(folder, settings.metrics)
    if not runs:
        raise ValueError(f"no completed run (a {POINT_FILE} beside a results.json) under {folder}")
    result = compare(runs, settings)
    out = RunOutput(output or folder)
    (out.path / "comparison.json").write_text(json.dumps(result, indent=1))
    (out.path / "summary.md").write_text(summary_markdown(result))
    plot_paired(result, out)
    return result
