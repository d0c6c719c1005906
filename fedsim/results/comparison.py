"""A sweep's comparison: the headline metrics over seeds (mean, spread, CI) and their paired
differences against a baseline, each with a verdict, from the run folders alone
(``fedsim compare <folder>``).

Runs are grouped by their overrides minus the seed keys (``sweep.seed_keys``); a group's runs
are replicates. A baseline is either a method name that appears as one component of a
results.json path (``selectors.fedbis.accuracy`` is the baseline of
``selectors.fedbiscuit_u3.accuracy``: the same run, so the same seed) or ``KEY=VALUE`` of a swept
override (the run with that value and otherwise the same overrides and seeds). Differences are
paired by seed: the per-seed difference removes what the seed moves in both.

Every paired difference gets a verdict (``fedsim/results/stats.py``): **shown** (its CI excludes 0),
**excluded** (its CI excludes the effect of interest, ``sweep.effect_of_interest``: the paper's
or a stated one), **inconclusive** (neither), **nominal** (a secondary row shown or excluded at
the nominal level whose Holm-adjusted p does not survive), with the minimum detectable effect at
``sweep.power`` for the observed spread and the seeds an effect of interest would need. When
every seed gives the same value there is no spread over seeds to claim anything from: the
comparison says so and uses the interval the experiment computes inside a run
(``sweep.run_intervals``, e.g. FedTP's paired bootstrap over turns), named in the summary.

A metric that already compares two arms inside each run on the same items (a head-to-head win
rate) has nothing to subtract: ``sweep.contrasts`` names it with its null (``equal_at``: 0.5), and its
difference from the null gets the same verdict and MDE as a paired row; an effect of interest
applies to it only when stated with ``baseline: equal_at`` (a difference from the null, never a
paired row's "method minus baseline").

The summary leads with the verdicts, then the headline metrics (``sweep.metrics``, one family
per pattern), one table and one plot panel (one unit per axis, titled with the measure's name and
unit: ``fedsim/results/display.py``) per family; counters, bytes and timings
(``sweep.bookkeeping``) close it as an appendix, with no CI and no paired rows.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from scipy import stats

from fedsim.config.schema import EffectOfInterest, Sweep
from fedsim.results.display import axis_label, context, measure
from fedsim.results.outputs import (
    MAX_FILE_BYTES,
    RunOutput,
    escape_controls,
    markdown_table,
    markdown_text,
    number_text,
    write_file,
)
from fedsim.results.stats import (
    detectable_effect,
    detectable_effect_of_interval,
    holm,
    seeds_needed,
    sequential_bounds,
    t_interval,
    verdict,
)

POINT_FILE = "point.json"  # a sweep run's overrides, beside its results.json
OUTPUTS = ("summary.md", "comparison.json", "paired_differences.png", "metrics.png")
BOOTSTRAP_MIN_SEEDS = 10  # below this the BCa interval over seeds undercovers (too narrow)
CONTRAST_BASELINE = "equal_at"  # the effect-of-interest baseline that names a contrast's null
MAX_PANELS = 20  # plot panels per figure; the summary says when families were left out
PLOT_CHARS = 160  # a plot label's characters at most; the summary keeps the whole name
MAX_DEPTH = 64  # folders a record nests at most (a run's are a few deep)


class ComparisonRefused(ValueError):
    """A metric pattern or baseline that the runs do not have, or a record holding a link:
    refused before anything is written."""


@dataclass(frozen=True)
class Run:
    """One completed run: its overrides (key -> value; every override of the run, so runs of
    sweeps with other constant overrides stay apart) and every number of its results.json."""

    folder: str
    overrides: dict[str, str]
    values: dict[str, float]


def flatten(results, prefix: str = "") -> dict[str, float]:
    """Every finite number of a results.json, by dotted path (list items by index)."""
    if isinstance(results, bool):
        return {}
    if isinstance(results, (int, float)):
        return {prefix: float(results)} if math.isfinite(results) else {}
    items = (
        results.items()
        if isinstance(results, dict)
        else enumerate(results)
        if isinstance(results, list)
        else ()
    )
    out = {}
    for key, value in items:
        if "." in str(key):
            raise ValueError(
                f"results key {prefix + '.' if prefix else ''}{key!r} contains '.': its dotted path "
                "would be ambiguous and no metric pattern could name it"
            )
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def path_pattern(pattern: str) -> re.Pattern:
    """A results path pattern: ``*`` is one dotted component (``selectors.*.accuracy`` is every
    method's, not each selector's ``selectors.m.each.0.accuracy``), ``**`` any number of them.
    Each wildcard is a group, in order (:func:`_fill` puts them into another path)."""
    parts = [
        "(.+)" if p == "**" else "([^.]*)".join(map(re.escape, p.split("*")))
        for p in pattern.split(".")
    ]
    return re.compile(r"\.".join(parts))


def _fill(template: str, groups: tuple[str, ...]) -> str:
    """``template`` with its wildcards replaced by ``groups`` in turn (``a.*.ci`` and ("x",): ``a.x.ci``)."""
    it = iter(groups)
    return re.sub(r"\*\*|\*", lambda _: next(it, "*"), template)


def _matches(patterns, path: str) -> bool:
    return any(path_pattern(p).fullmatch(path) for p in patterns)


def refuse_links(folder: str | Path) -> list[Path]:
    """Refuse ``folder`` when anything under it is a link, or neither a file nor a folder (a FIFO
    blocks its reader), or it nests folders :data:`MAX_DEPTH` deep (1,100 ended the walk in a
    RecursionError). A record is someone else's files (``cp -r`` and git keep links): a link in
    it would have fedsim read the user's files as results, or write its outputs where it points
    (``~/.ssh/authorized_keys``). Every entry is ``lstat``'ed, no link followed (``os.walk``).
    Returns the folders walked, ``folder`` first."""

    def unreadable(exc: OSError):
        raise ComparisonRefused(
            f"{exc.filename!r} cannot be listed, so it cannot be checked for links: {exc}"
        )

    folders = []
    for root, dirs, files in os.walk(folder, onerror=unreadable):
        folders.append(Path(root))
        if len(folders[-1].relative_to(folder).parts) >= MAX_DEPTH:
            raise ComparisonRefused(f"{root!r}: a record nests folders {MAX_DEPTH} deep at most")
        for path in (Path(root, name) for name in [*dirs, *files]):
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise ComparisonRefused(
                    f"{str(path)!r} is a link (to {os.readlink(path)!r}): a sweep record may "
                    f"hold no links, and {str(folder)!r} is refused before anything in it is read"
                )
            if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
                raise ComparisonRefused(
                    f"{str(path)!r} is neither a file nor a folder: {str(folder)!r} is refused "
                    "before anything in it is read"
                )
    return folders


def read_record(path: Path) -> str:
    """The text of a record's file (results.json, point.json, config.yaml, sweep.json), refused,
    naming it, when it is not a plain file (opened without following a link or waiting on a
    FIFO), holds over :data:`MAX_FILE_BYTES` (the most a run ships of one file: a sparse 1 GiB
    results.json, 8 blocks on disk, took 2.3 GB of memory to read whole) or is not UTF-8."""
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise ComparisonRefused(f"{str(path)!r} is not a file")
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ComparisonRefused(f"{str(path)!r} cannot be read: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ComparisonRefused(
            f"{str(path)!r} holds over {MAX_FILE_BYTES >> 20} MiB: no run's file is that large"
        )
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise ComparisonRefused(f"{str(path)!r} is not UTF-8 text: {exc}") from None


def read_json(path: Path):
    """A record's JSON file (:func:`read_record`), refused when it does not parse."""
    text = read_record(path)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ComparisonRefused(f"{str(path)!r} is not JSON: {exc}") from None


def read_config(path: Path) -> DictConfig:
    """A record's config.yaml (:func:`read_record`), refused when it is no YAML mapping or holds
    an alias (``*a``): a run's config.yaml holds none (OmegaConf writes it resolved), and a few
    hundred bytes of nested aliases, which PyYAML shares, become billions of nodes in OmegaConf."""
    text = read_record(path)
    try:
        if any(
            isinstance(event, yaml.AliasEvent) for event in yaml.parse(text, Loader=yaml.SafeLoader)
        ):
            raise ComparisonRefused(
                f"{str(path)!r} holds a YAML alias, which no run's config.yaml has"
            )
        config = OmegaConf.create(text)
    except (yaml.YAMLError, OmegaConfBaseException, RecursionError) as exc:
        raise ComparisonRefused(f"{str(path)!r} is not a run's config.yaml: {exc}") from None
    if not isinstance(config, DictConfig):
        raise ComparisonRefused(f"{str(path)!r} is not a run's config.yaml: not a mapping")
    return config


def counted_runs(folder: str | Path) -> list[Path]:
    """The folder of every run under ``folder`` that a comparison counts: a ``point.json`` and a
    ``results.json`` and no ``error.txt`` (runs copied in from other machines count alike). A run
    that failed after writing its results (a privacy audit refuting its epsilon, a phase after
    them) is left out: its numbers are not a result. ``folder`` holding a link is refused
    (:func:`refuse_links`) before anything in it is read."""
    refuse_links(folder)
    return [
        point.parent
        for point in sorted(Path(folder).rglob(POINT_FILE))
        if (point.parent / "results.json").is_file() and not (point.parent / "error.txt").exists()
    ]


def load_runs(folder: str | Path) -> list[Run]:
    """Every run :func:`counted_runs` finds under ``folder``, with every number of its results."""
    runs = []
    for run in counted_runs(folder):
        point = read_json(run / POINT_FILE)
        overrides = point.get("overrides") if isinstance(point, dict) else None
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise ComparisonRefused(
                f"{str(run / POINT_FILE)!r} holds no list of overrides (KEY=VALUE strings)"
            )
        runs.append(
            Run(
                str(run),
                dict(o.partition("=")[::2] for o in overrides),
                flatten(read_json(run / "results.json")),
            )
        )
    return runs


# ---- statistics of one metric over seeds ------------------------------------------------------


def interval(x: np.ndarray, settings: Sweep, seed: int = 0) -> tuple[float, float] | None:
    """CI of the mean of ``x`` (one value per seed): Student t, or scipy's BCa bootstrap. None
    with fewer than two values or no spread: a constant over seeds supports no interval."""
    x = np.asarray(x, float)
    t = t_interval(x, settings.level)
    if settings.interval == "t" or t is None:
        return t
    res = stats.bootstrap(
        (x,),
        np.mean,
        confidence_level=settings.level,
        method="BCa",
        n_resamples=9999,
        rng=np.random.default_rng(seed),
    )
    lo, hi = res.confidence_interval
    return float(lo), float(hi)


def describe(x: np.ndarray, settings: Sweep) -> dict:
    """n, mean, std and CI over seeds; ``constant`` when every seed gives the same value."""
    x = np.asarray(x, float)
    return {
        "n": int(x.size),
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if x.size > 1 else None,
        "ci": list(ci) if (ci := interval(x, settings)) else None,
        "constant": bool(x.size > 1 and np.ptp(x) == 0),
    }


def _effect_of_interest(
    metric: str, settings: Sweep, contrast: bool = False
) -> EffectOfInterest | None:
    """The effect stated for ``metric`` against this comparison's baseline: "FedE4RAG minus
    FedAvg" says nothing of FedE4RAG minus the vanilla model (``sweep.baseline=vanilla``). A
    contrast's effect is a difference from its null, stated with ``baseline: equal_at``, and
    applies to nothing else."""
    return next(
        (
            e
            for e in settings.effect_of_interest
            if path_pattern(e.metric).fullmatch(metric)
            and e.baseline in ((CONTRAST_BASELINE,) if contrast else (None, settings.baseline))
        ),
        None,
    )


def _run_interval(metric: str, baseline: str | None, by_seed: dict, settings: Sweep) -> dict | None:
    """The experiment's own interval for ``metric`` (minus ``baseline``) inside one run, from
    the first seed's run that holds it: ``{"ci", "method", "run"}``."""
    for entry in settings.run_intervals:
        found = path_pattern(entry.metric).fullmatch(metric)
        if not found or (entry.baseline is None) != (baseline is None):
            continue
        if baseline is not None and not path_pattern(entry.baseline).fullmatch(baseline):
            continue
        path = _fill(entry.ci, found.groups())
        for _, run in sorted(by_seed.items()):
            if f"{path}.0" in run.values and f"{path}.1" in run.values:
                return {
                    "ci": [run.values[f"{path}.0"], run.values[f"{path}.1"]],
                    "method": entry.method,
                    "path": path,
                    "run": Path(run.folder).name,
                }
    return None


def judge(
    values: np.ndarray,
    metric: str,
    baseline: str | None,
    by_seed: dict,
    settings: Sweep,
    null: float | None = None,
) -> dict:
    """A difference (or a metric) over seeds with its verdict: the CI over seeds when the seeds
    spread; else the run's own interval (``sweep.run_intervals``) if the experiment has one,
    named in ``basis``; else no claim. MDE and the seeds an effect of interest needs. ``null``:
    ``values`` are a contrast minus its null (the run's own interval of the metric is shifted alike)."""
    compared = baseline is not None or null is not None
    out = describe(values, settings)
    effect = _effect_of_interest(metric, settings, contrast=null is not None) if compared else None
    out["effect"] = dataclasses.asdict(effect) if effect else None
    if out["ci"] is not None:
        sd = out["std"]
        out["basis"] = "t over seeds" if settings.interval == "t" else "BCa bootstrap over seeds"
        out["mde"] = detectable_effect(sd, out["n"], settings.level, settings.power)
        out["seeds_needed"] = (
            seeds_needed(effect.size, sd, settings.level, settings.power) if effect else None
        )
        if compared:
            out["p_value"] = float(stats.ttest_1samp(values, 0.0).pvalue)
    else:
        own = _run_interval(metric, baseline, by_seed, settings)
        if own is not None and null is not None:
            own = {**own, "ci": [c - null for c in own["ci"]]}
        spread = "every seed gives the same value" if out["constant"] else "one seed"
        out["basis"] = f"{spread}; no claim over seeds"
        out["mde"] = out["seeds_needed"] = None
        if own is not None and own["ci"][1] > own["ci"][0]:
            out["ci"], out["run_interval"] = own["ci"], own
            out["basis"] = (
                f"{spread}; the run's own {own['method']} ({own['path']}, run {own['run']})"
            )
            out["mde"] = detectable_effect_of_interval(own["ci"], settings.level, settings.power)
        elif own is not None:  # every item gives the same difference too: nothing to infer from
            out["basis"] = f"{spread}; the run's own {own['method']} has no width either; no claim"
    size = effect.size if effect else None
    out["verdict"] = verdict(out["ci"], size) if compared else None
    out["excludes_effect"] = (
        None
        if size is None or out["ci"] is None
        else bool(out["ci"][1] < size if size > 0 else out["ci"][0] > size)
    )
    return out


# ---- the plan's looks and the family of comparisons ------------------------------------------


def look_at(n: int, plan: dict | None, earlier: tuple[int, ...]) -> dict | None:
    """This comparison as a look of ``plan`` at ``n`` completed seeds: the seed counts read so
    far (``earlier`` below ``n``, then ``n``), and the Lan-DeMets boundary at their information
    fractions n / planned seeds (:func:`~fedsim.results.stats.sequential_bounds`), as a z and as
    the confidence level of the repeated CI. None without a plan; past the plan, no boundary."""
    if plan is None:
        return None
    planned = plan["seeds"]
    looks = sorted({m for m in earlier if m < n} | {n})
    out = {
        "n": n,
        "planned_seeds": planned,
        "planned_looks": list(plan["looks"]),
        "looks": looks,
        "unplanned": [m for m in looks if m not in plan["looks"]],
        "spending": plan["spending"],
    }
    if n > planned:
        return {**out, "status": "past the plan", "boundary_z": None, "level": None}
    z = sequential_bounds([m / planned for m in looks], plan["alpha"], plan["spending"])[-1]
    return {
        **out,
        "status": "final" if n == planned else "interim",
        "boundary_z": z,
        "level": float(1.0 - 2.0 * stats.norm.sf(z)),
    }


def _claim_p(row: dict) -> float | None:
    """The two-sided p of the claim a row's nominal verdict makes: against its effect of
    interest when it reads excluded, else against 0 (the t-test over seeds, or the normal
    approximation of the run's own interval, its SE from the half-width); None without a CI."""
    if row["ci"] is None:
        return None
    null = row["effect"]["size"] if row["verdict"] == "excluded" else 0.0
    if "p_value" in row:
        return float(stats.ttest_1samp(row["per_seed"], null).pvalue) if null else row["p_value"]
    lo, hi = row["ci"]
    se = (hi - lo) / (2.0 * stats.norm.isf((1.0 - row["level"]) / 2.0))
    return float(2.0 * stats.norm.sf(abs((lo + hi) / 2.0 - null) / se))


def judge_family(rows: list[dict], settings: Sweep, look: dict | None) -> dict:
    """Each paired or contrast row's role and final verdict. A primary row (``sweep.plan.primary``)
    at a look within the plan: its CI at the look's level (the repeated CI) and its verdict from
    that. Every other row is secondary: Holm-adjusted over all of them at the plan's alpha (1 -
    ``sweep.level`` without a plan), and a verdict that does not survive reads ``nominal``.
    Returns the count of each."""
    plan = settings.planned()
    alpha = plan["alpha"] if plan else round(1.0 - settings.level, 12)
    secondary = []
    for row in rows:
        row["level"] = settings.level
        row["nominal_verdict"] = row["verdict"]
        row["role"] = (
            "primary" if plan and _matches(plan["primary"], row["metric"]) else "secondary"
        )
        if row["role"] == "secondary":
            secondary.append(row)
        elif look["level"] is not None and "p_value" in row:
            row["level"] = look["level"]
            row["ci"] = interval(
                row["per_seed"], dataclasses.replace(settings, level=look["level"])
            )
            size = row["effect"]["size"] if row["effect"] else None
            row["verdict"] = row["nominal_verdict"] = verdict(row["ci"], size)
            row["excludes_effect"] = (
                None
                if size is None or row["ci"] is None
                else bool(row["ci"][1] < size if size > 0 else row["ci"][0] > size)
            )
    tested = [(r, p) for r in secondary if (p := _claim_p(r)) is not None]
    for (row, _), survives, adjusted in zip(tested, *holm([p for _, p in tested], alpha)):
        row["p_holm"] = adjusted
        if row["verdict"] in ("shown", "excluded") and not survives:
            row["verdict"] = "nominal"
    return {"primary": len(rows) - len(secondary), "secondary": len(secondary), "holm_alpha": alpha}


# ---- grouping, families and the baseline ------------------------------------------------------


def _group_key(run: Run, seed_keys: tuple[str, ...]) -> tuple:
    return tuple(sorted((k, v) for k, v in run.overrides.items() if k not in seed_keys))


def _seed_of(run: Run, seed_keys: tuple[str, ...]) -> tuple:
    return tuple(sorted((k, v) for k, v in run.overrides.items() if k in seed_keys))


def _label(group: tuple, varying: set[str]) -> str:
    """The group's overrides that differ between the compared runs (the rest is common)."""
    return " ".join(f"{k}={v}" for k, v in group if k in varying) or "(all runs)"


def _varying(runs: list[Run], seed_keys: tuple[str, ...]) -> dict[str, list[str]]:
    """Overrides (not seed keys) whose value differs between runs -> their values."""
    keys = {k for r in runs for k in r.overrides if k not in seed_keys}
    values = {k: sorted({r.overrides.get(k) for r in runs}, key=str) for k in keys}
    return {k: [v for v in vs if v is not None] for k, vs in values.items() if len(vs) > 1}


def families(
    paths: set[str], settings: Sweep, strict: bool = True
) -> tuple[dict[str, list[str]], list[str]]:
    """(headline family -> its metrics, bookkeeping metrics). A family is a ``sweep.metrics``
    pattern (the first that matches a path), in the configured order; with none configured,
    each path's last component, for every path that is not bookkeeping. A pattern that matches
    nothing is refused, naming the nearest paths, when ``strict`` (the user wrote it); an
    experiment's own pattern for a phase these runs left out (e.g. RLHF off) is an empty family."""
    headline: dict[str, list[str]] = {}
    for pattern in settings.metrics:
        found = sorted(p for p in paths if path_pattern(pattern).fullmatch(p))
        if not found and strict:
            near = difflib.get_close_matches(pattern, sorted(paths), n=8, cutoff=0.4)
            raise ComparisonRefused(
                f"sweep.metrics pattern {pattern!r} matches no number in the runs' results.json"
                f"; nearest paths: {', '.join(near) or '(none)'}"
            )
        taken = {m for ms in headline.values() for m in ms}
        headline[pattern] = [p for p in found if p not in taken]
    if not settings.metrics:
        for path in sorted(paths):
            if not _matches(settings.bookkeeping, path):
                headline.setdefault(path.rsplit(".", 1)[-1], []).append(path)
    chosen = {m for ms in headline.values() for m in ms}
    return (
        {f: ms for f, ms in headline.items() if ms},
        sorted(p for p in paths if p not in chosen and _matches(settings.bookkeeping, p)),
    )


def headline(results: dict, settings: Sweep) -> dict[str, float]:
    """A run's headline numbers: its results.json paths in the families of ``sweep.metrics``."""
    values = flatten(results)
    family_of, _ = families(set(values), settings, strict=False)
    return {m: values[m] for ms in family_of.values() for m in ms}


def _baseline_path(path: str, name: str, known: set[str]) -> str | None:
    """``path`` with one component replaced by ``name``, if that path exists (and differs)."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        candidate = ".".join([*parts[:i], name, *parts[i + 1 :]])
        if part != name and candidate in known:
            return candidate
    return None


def method_names(paths) -> list[str]:
    """The path components a method-name baseline can be: those at a position where paths that
    agree everywhere else hold two or more names."""
    at: dict[tuple, set[str]] = {}
    for path in paths:
        parts = path.split(".")
        for i, part in enumerate(parts):
            at.setdefault((i, tuple(parts[:i]), tuple(parts[i + 1 :])), set()).add(part)
    return sorted({n for names in at.values() if len(names) > 1 for n in names})


def _check_baseline(settings: Sweep, headline: set[str], varying: dict[str, list[str]]) -> None:
    """Refuse a baseline that pairs nothing, naming the choices."""
    if not settings.baseline:
        return
    key, sep, value = settings.baseline.partition("=")
    swept = (
        "; ".join(f"{k}={'|'.join(vs)}" for k, vs in sorted(varying.items()))
        or "(no override varies)"
    )
    if sep:
        if value not in varying.get(key, []):
            raise ComparisonRefused(
                f"sweep.baseline {settings.baseline!r}: {key} does not take the value {value!r} "
                f"in these runs; overrides that vary: {swept}"
            )
        return
    names = method_names(headline)
    if key not in names:
        raise ComparisonRefused(
            f"sweep.baseline {key!r} names no method in the headline metrics' paths; methods: "
            f"{', '.join(names) or '(none)'}; or KEY=VALUE of an override that varies: {swept}"
        )


def compare(
    runs: list[Run], settings: Sweep, strict: bool = True, earlier_looks: tuple[int, ...] = ()
) -> dict:
    """Per group and headline metric: mean, std and CI over seeds; per baseline pair: the
    paired difference per seed, its CI and verdict; bookkeeping metrics over seeds apart. The
    primary rows of ``settings.plan`` are judged at this look (``earlier_looks``: the seed
    counts at which the sweep was read before), every other row Holm-adjusted (:func:`judge_family`).
    Raises :class:`ComparisonRefused` for a baseline the runs do not have, and (``strict``) a
    metric pattern."""
    by_group: dict[tuple, dict[tuple, Run]] = {}
    for run in runs:
        by_group.setdefault(_group_key(run, settings.seed_keys), {})[
            _seed_of(run, settings.seed_keys)
        ] = run
    varying = _varying(runs, settings.seed_keys)
    family_of, bookkeeping = families({k for r in runs for k in r.values}, settings, strict)
    headline = {m: f for f, ms in family_of.items() for m in ms}
    _check_baseline(settings, set(headline), varying)
    groups = []
    for group, by_seed in sorted(by_group.items()):
        present = sorted({k for r in by_seed.values() for k in r.values})

        def over_seeds(metric, by_seed=by_seed):
            values = np.array(
                [r.values[metric] for _, r in sorted(by_seed.items()) if metric in r.values]
            )
            return judge(values, metric, None, by_seed, settings)

        groups.append(
            {
                "group": {k: v for k, v in group if k in varying},
                "label": _label(group, set(varying)),
                "runs": len(by_seed),
                "metrics": {
                    m: {"family": headline[m], **over_seeds(m)} for m in present if m in headline
                },
                "bookkeeping": {
                    m: describe([r.values[m] for r in by_seed.values() if m in r.values], settings)
                    for m in present
                    if m in bookkeeping
                },
            }
        )
    paired = _paired_all(by_group, settings, set(varying), headline)
    contrasts = _contrasts_all(by_group, settings, set(varying), headline)
    look = look_at(
        len({_seed_of(r, settings.seed_keys) for r in runs}), settings.planned(), earlier_looks
    )
    family = judge_family(paired + contrasts, settings, look)
    few = settings.interval == "bootstrap" and any(
        d["n"] < BOOTSTRAP_MIN_SEEDS for g in groups for d in g["metrics"].values()
    )
    return {
        "settings": {
            "seed_keys": list(settings.seed_keys),
            "baseline": settings.baseline,
            "interval": settings.interval,
            "level": settings.level,
            "power": settings.power,
            "plan": settings.planned(),
        },
        "runs": len(runs),
        "families": family_of,
        "bookkeeping": bookkeeping,
        "groups": groups,
        "paired": paired,
        "contrasts": contrasts,
        "look": look,
        "comparisons": family,
        "not_in_runs": [p for p in settings.metrics if p not in family_of],
        "warnings": [
            f"sweep.interval=bootstrap over fewer than {BOOTSTRAP_MIN_SEEDS} seeds: the BCa interval "
            "is too narrow there (it undercovers); sweep.interval=t is the default"
        ]
        * few
        + [
            f"sweep.contrasts pattern {c.metric} matches no headline metric: no verdict for it"
            for c in settings.contrasts
            if not any(path_pattern(c.metric).fullmatch(m) for m in headline)
        ],
    }


def _paired_all(
    by_group: dict[tuple, dict[tuple, Run]],
    settings: Sweep,
    varying: set[str],
    headline: dict[str, str],
) -> list[dict]:
    if not settings.baseline:
        return []
    key, sep, value = settings.baseline.partition("=")
    rows = []
    for group, by_seed in sorted(by_group.items()):
        present = sorted({k for r in by_seed.values() for k in r.values})
        pairs = {}
        if sep:  # a swept override's value: the same group with KEY=VALUE, seed by seed
            base_group = tuple(sorted({**dict(group), key: value}.items()))
            if base_group == group or base_group not in by_group or key not in dict(group):
                continue
            base = by_group[base_group]
            for m in (m for m in present if m in headline):
                pairs[m] = (
                    m,
                    {
                        s: r.values[m] - base[s].values[m]
                        for s, r in by_seed.items()
                        if s in base and m in r.values and m in base[s].values
                    },
                )
            label, own = f"{_label(group, varying)} - {settings.baseline}", None
        else:  # a method inside each run: the same run's path with the baseline's name
            known = set(present)
            for m in (m for m in present if m in headline):
                if b := _baseline_path(m, settings.baseline, known):
                    pairs[m] = (
                        b,
                        {
                            s: r.values[m] - r.values[b]
                            for s, r in by_seed.items()
                            if m in r.values and b in r.values
                        },
                    )
            label, own = _label(group, varying), by_seed
        common = {"group": {k: v for k, v in group if k in varying}, "label": label}
        for m, (b, diffs) in pairs.items():
            if diffs:
                seeds = sorted(diffs)
                d = np.array([diffs[s] for s in seeds])
                rows.append(
                    {
                        **common,
                        "metric": m,
                        "family": headline[m],
                        "baseline": b,
                        "seeds": [dict(s) for s in seeds],
                        "per_seed": d.tolist(),
                        **judge(d, m, b, own or {}, settings),
                    }
                )
    return rows


def _null_of(metric: str, settings: Sweep) -> float | None:
    """The null of the contrast entries ``metric`` matches; refused when two disagree."""
    nulls = {c.equal_at for c in settings.contrasts if path_pattern(c.metric).fullmatch(metric)}
    if len(nulls) > 1:
        raise ComparisonRefused(
            f"sweep.contrasts: {metric} matches entries with different equal_at {sorted(nulls)}"
        )
    return next(iter(nulls), None)


def _contrasts_all(
    by_group: dict[tuple, dict[tuple, Run]],
    settings: Sweep,
    varying: set[str],
    headline: dict[str, str],
) -> list[dict]:
    """Each headline metric named in ``sweep.contrasts``, per group: its value minus its null per
    seed, judged as a paired difference is (no baseline is needed or used)."""
    rows = []
    for group, by_seed in sorted(by_group.items()):
        for m in sorted({k for r in by_seed.values() for k in r.values} & set(headline)):
            if (null := _null_of(m, settings)) is None:
                continue
            held = [(s, r) for s, r in sorted(by_seed.items()) if m in r.values]
            d = np.array([r.values[m] - null for _, r in held])
            rows.append(
                {
                    "group": {k: v for k, v in group if k in varying},
                    "label": _label(group, varying),
                    "metric": m,
                    "family": headline[m],
                    "null": null,
                    "seeds": [dict(s) for s, _ in held],
                    "per_seed": d.tolist(),
                    **judge(d, m, None, by_seed, settings, null=null),
                }
            )
    return rows


# ---- the summary, the plan and the plots ------------------------------------------------------


def _ci_text(ci) -> str:
    return "" if ci is None else f"[{number_text(ci[0])}, {number_text(ci[1])}]"


def _count_ci_text(ci, metric: str) -> str:
    """A headline metric's CI over seeds, its lower end clipped at 0 for a count
    (:func:`fedsim.results.display.measure`): a t interval of a count over few seeds reaches below
    0, where no count lies; marked ``(clipped at 0)``."""
    if ci is None or not measure(metric).count or ci[0] >= 0:
        return _ci_text(ci)
    return f"{_ci_text([0.0, ci[1]])} (clipped at 0)"


def _num(value, digits: int = 4) -> str:
    return (
        ""
        if value is None
        else number_text(value, digits, sign=True)
        if isinstance(value, float)
        else str(value)
    )


def _effect_text(p: dict) -> str:
    e = p.get("effect")
    return "" if e is None else f"{e['size']:+g} ({e['source']})"


def _row_metric(p: dict) -> str:
    """A paired row's metric, or a contrast's minus its null."""
    return p["metric"] if "null" not in p else f"{p['metric']} - {p['null']:g}"


def _verdict_text(p: dict) -> str:
    if p["verdict"] == "nominal":
        return f"nominal ({p['nominal_verdict']} at the nominal level only)"
    return p["verdict"] or "no claim"


def _paired_row(p: dict) -> dict:
    return {
        "group": p["label"],
        "metric": _row_metric(p),
        "n": p["n"],
        "mean diff": p["mean"],
        "CI": _ci_text(p["ci"]),
        "p (t)": p.get("p_value", ""),
        "role": p["role"],
        "p (Holm)": p.get("p_holm", ""),
        "verdict": _verdict_text(p),
        "effect of interest": _effect_text(p),
        "excludes it": ""
        if p["excludes_effect"] is None
        else ("yes" if p["excludes_effect"] else "no"),
        "MDE": _num(p["mde"]).lstrip("+"),
        "seeds for it": p["seeds_needed"] or "",
        "basis": p["basis"],
    }


PAIRED_COLUMNS = [
    "group",
    "metric",
    "n",
    "mean diff",
    "CI",
    "p (t)",
    "role",
    "p (Holm)",
    "verdict",
    "effect of interest",
    "excludes it",
    "MDE",
    "seeds for it",
    "basis",
]
OVER_SEEDS_COLUMNS = ["group", "metric", "n", "mean", "std", "CI", "basis"]


def _plan_text(comparison: dict) -> str:
    """The plan, the look and the family: what the verdicts below are judged at."""
    counts, look, plan = (
        comparison["comparisons"],
        comparison["look"],
        comparison["settings"]["plan"],
    )
    family = (
        f"This comparison holds {counts['primary'] + counts['secondary']} comparisons: {counts['primary']} "
        f"primary, {counts['secondary']} secondary, Holm-adjusted at family-wise alpha {counts['holm_alpha']:g} "
        "(p (Holm)); a secondary verdict that does not survive reads **nominal**."
    )
    if plan is None:
        return f"**No plan** (sweep.plan): no endpoint is primary, no verdict was pre-registered. {family}"
    seen = (
        f"seeds read at {', '.join(map(str, look['looks']))} of {look['planned_seeds']} planned"
        + (f" (unplanned: {', '.join(map(str, look['unplanned']))})" if look["unplanned"] else "")
    )
    if look["level"] is None:
        at = (
            f"**Past the plan**: {look['n']} seeds, {look['planned_seeds']} planned; the primary verdicts are "
            "at the nominal level, outside the plan"
        )
    else:
        at = (
            f"Look at {look['n']} seeds ({look['status']}; {seen}): the primary rows' CI is the repeated CI at "
            f"{look['level']:.4%} (Lan-DeMets {look['spending'].replace('_', '-')} spending of alpha "
            f"{plan['alpha']:g}, boundary |z| {look['boundary_z']:.3f})"
        )
    return f"Plan (sweep.plan): primary {markdown_text(', '.join(plan['primary']))}. {at}. {family}"


VERDICT_COLUMNS = ["what", "group", "mean diff", "CI", "verdict"]


def _verdicts(comparison: dict) -> str:
    """The summary's lead: each paired or contrast row in a reader's words, its difference, CI
    and verdict; the full rows (p, Holm, MDE, basis) follow in their section."""
    rows = [
        {
            "what": _what(p["metric"], p["family"])
            + ("" if "null" in p else f" - {comparison['settings']['baseline']}"),
            "group": p["label"],
            "mean diff": p["mean"],
            "CI": _ci_text(p["ci"]),
            "verdict": _verdict_text(p),
        }
        for p in comparison["paired"] + comparison["contrasts"]
    ]
    if not rows:
        return (
            "## Verdicts\n\nNo verdict: no baseline (sweep.baseline) and no contrast "
            "(sweep.contrasts) to judge a difference against; the headline metrics over seeds follow."
        )
    one_group = all(r["group"] == "(all runs)" for r in rows)
    columns = [c for c in VERDICT_COLUMNS if c != "group" or not one_group]
    return "## Verdicts\n\n" + markdown_table(rows, columns)


def _over_seeds_rows(comparison: dict, family: str) -> list[dict]:
    return [
        {
            "group": g["label"],
            "what": _what(m, d["family"]),
            "metric": m,
            "n": d["n"],
            "mean": d["mean"],
            "std": d["std"],
            "CI": _count_ci_text(d["ci"], m),
            "basis": d["basis"],
        }
        for g in comparison["groups"]
        for m, d in g["metrics"].items()
        if d["family"] == family
    ]


def _bookkeeping(comparison: dict) -> str | None:
    """The appendix: counters, bytes and timings over seeds, mean and spread without a CI (a t
    interval of a count over few seeds reaches below 0, and no claim rests on them)."""
    rows = [
        {"group": g["label"], "metric": m, "n": d["n"], "mean": d["mean"], "std": d["std"]}
        for g in comparison["groups"]
        for m, d in g["bookkeeping"].items()
    ]
    if not rows:
        return None
    return (
        "## Appendix: bookkeeping (counters, bytes, timings: sweep.bookkeeping)\n\nMean and "
        "standard deviation over seeds, no CI: these are counts and durations, which no claim "
        "rests on, and a t interval over few seeds reaches below 0, where none lies.\n\n"
        + markdown_table(rows, ["group", "metric", "n", "mean", "std"])
    )


def summary_markdown(comparison: dict) -> str:
    """The comparison's summary.md: the verdicts first, then the headline metrics over seeds
    (in a reader's words, :mod:`fedsim.results.display`), the paired rows in full, and the
    bookkeeping as an appendix."""
    s = comparison["settings"]
    how = (
        "Student t interval over seeds"
        if s["interval"] == "t"
        else "BCa bootstrap over seeds (scipy)"
    )
    level, power = int(round(s["level"] * 100)), int(round(s["power"] * 100))
    text = [
        f"# Sweep comparison\n\n{comparison['runs']} completed runs; replicates: "
        f"{markdown_text(', '.join(s['seed_keys']))}; {level}% CI: {how}.",
        *[f"**Warning: {markdown_text(w)}.**" for w in comparison["warnings"]],
        _verdicts(comparison),
    ]
    legend = (
        f"Verdict: **shown** (the CI excludes 0), **excluded** (it excludes the effect of interest: the "
        f"paper's or a stated one), **inconclusive** (neither), **nominal** (shown or excluded at the "
        f"nominal level, not after Holm); no claim without spread. MDE: the smallest true difference a "
        f"two-sided paired t-test over these seeds finds with {power}% power at the observed "
        f"spread (for a run's own interval: its normal approximation). Seeds for it: the seeds the effect of "
        f"interest needs for {power}% power at that spread."
    )
    if comparison["paired"] or comparison["contrasts"]:
        text.append(_plan_text(comparison))
    text.append(
        "## Headline metrics over seeds\n\nA count's CI (turns, words, seconds) is clipped at 0, "
        "and says so."
    )
    for family in comparison["families"]:
        text.append(
            f"### {markdown_text(axis_label(family))}: {markdown_text(family)}\n\n"
            + markdown_table(
                _over_seeds_rows(comparison, family), ["group", "what", *OVER_SEEDS_COLUMNS[1:]]
            )
        )
    if comparison["paired"]:
        baseline = markdown_text(s["baseline"])
        text.append(
            f"## Paired differences against the baseline ({baseline}), per seed\n\n{legend}"
        )
        for family in comparison["families"]:
            rows = [_paired_row(p) for p in comparison["paired"] if p["family"] == family]
            if rows:
                text.append(
                    f"### {markdown_text(family)}\n\n" + markdown_table(rows, PAIRED_COLUMNS)
                )
    if comparison["contrasts"]:
        text.append(
            "## Contrasts against their null (sweep.contrasts), per seed\n\nMetrics that compare two arms "
            "inside each run on the same items (a head-to-head win rate): the value minus its null (equal_at), "
            f"judged as a paired difference is. {legend}\n\n"
            + markdown_table([_paired_row(p) for p in comparison["contrasts"]], PAIRED_COLUMNS)
        )
    if comparison["not_in_runs"]:
        text.append(
            f"Headline patterns these runs hold no number for: "
            f"{markdown_text(', '.join(comparison['not_in_runs']))}."
        )
    if len(comparison["families"]) > MAX_PANELS:
        text.append(
            f"The plots show the first {MAX_PANELS} of {len(comparison['families'])} families."
        )
    if appendix := _bookkeeping(comparison):
        text.append(appendix)
    return "\n\n".join(text) + "\n"


def plan(comparison: dict) -> str:
    """``fedsim compare --plan``: from a pilot sweep, per headline paired difference the spread
    over seeds, the MDE now, and the seeds that reach ``power`` for the effect of interest and
    for the difference observed."""
    s = comparison["settings"]
    rows = []
    for p in comparison["paired"] + comparison["contrasts"]:
        sd = p["std"] if p["ci"] is not None and "run_interval" not in p else None
        observed = seeds_needed(p["mean"], sd, s["level"], s["power"]) if sd else None
        rows.append(
            {
                "group": p["label"],
                "metric": _row_metric(p),
                "n": p["n"],
                "mean diff": p["mean"],
                "sd of diff": "" if sd is None else sd,
                "MDE now": _num(p["mde"]).lstrip("+"),
                "effect of interest": _effect_text(p),
                "seeds for it": p["seeds_needed"] or "",
                "seeds for the observed diff": observed or "",
                "note": "" if sd else p["basis"],
            }
        )
    if not rows:
        return "fedsim: plan: no paired difference (set sweep.baseline) and no contrast (sweep.contrasts)\n"
    return (
        f"Seeds for {int(round(s['power'] * 100))}% power (two-sided paired t-test, alpha "
        f"{1 - s['level']:.2g}) at each difference's spread in this pilot:\n\n"
        + markdown_table(
            rows,
            [
                "group",
                "metric",
                "n",
                "mean diff",
                "sd of diff",
                "MDE now",
                "effect of interest",
                "seeds for it",
                "seeds for the observed diff",
                "note",
            ],
        )
        + "\n"
    )


TICK_CHARS = 56  # a row's tick label at most (8 pt on a 7-inch figure); the summary has it whole
FONT = {"tick": 8, "label": 9, "title": 10}  # points at the saved size: 8 at least


def _interval_kind(row: dict, level: float) -> str:
    """What a row's drawn interval is, as its legend says: the CI over seeds at its level (a
    primary row at a look: the repeated CI's), or the run's own interval."""
    pct = f"{100 * row.get('level', level):.4g}% CI"
    if "run_interval" in row:
        return f"mean, {pct}: the run's own {row['run_interval']['method']}"
    return f"mean, {pct} over seeds"


def _forest(axes, rows_by_family: dict[str, list[dict]], xlabel, zero: bool, level: float) -> None:
    """Each family its own panel, titled with its measure: each row's mean with its CI as the
    error bar (a hollow point where there is no interval: one seed, or every seed the same); 0
    and the effect of interest marked. A legend names every marker drawn."""
    for ax, (family, rows) in zip(axes, rows_by_family.items()):
        y = np.arange(len(rows))[::-1]
        for yi, r in zip(y, rows):
            m = r["mean"]
            if r["ci"] is None:
                ax.plot(
                    m,
                    yi,
                    "o",
                    mfc="none",
                    color="C7",
                    label="mean, no interval (one seed or no spread)",
                )
            else:
                ax.errorbar(
                    m,
                    yi,
                    xerr=[[m - r["ci"][0]], [r["ci"][1] - m]],
                    fmt="o",
                    capsize=3,
                    color="C1" if "run_interval" in r else "C0",
                    label=_interval_kind(r, level),
                )
            if r.get("effect"):
                ax.plot(r["effect"]["size"], yi, "x", color="C3", label="effect of interest")
        if zero:
            ax.axvline(0.0, color="grey", lw=0.8, ls="--", label="no difference")
        # a record's names, shown as written: no mathtext ("$\\frac{$" refused the comparison)
        ax.set_yticks(y, [_plot_text(r["name"], TICK_CHARS) for r in rows], parse_math=False)
        ax.tick_params(labelsize=FONT["tick"])
        ax.set_title(_plot_text(_family_title(family)), fontsize=FONT["title"], parse_math=False)
        ax.set_xlabel(_plot_text(xlabel(family)), fontsize=FONT["label"], parse_math=False)
    kinds = {}  # one legend entry per marker kind, of every panel
    for ax in axes:
        kinds.update(zip(*ax.get_legend_handles_labels()[::-1]))
    axes[0].figure.legend(
        kinds.values(), kinds.keys(), loc="outside lower center", ncols=2, fontsize=FONT["tick"]
    )


def _plot_text(text: str, chars: int = 0) -> str:
    """A record's name as a plot label: control characters escaped (a lone surrogate raised in the
    font code), cut to ``chars`` (default :data:`PLOT_CHARS`; one of 100,000 characters took 51 s
    to draw)."""
    text, chars = escape_controls(text), chars or PLOT_CHARS
    return text if len(text) <= chars else text[: chars - 1] + "…"


def plot(comparison: dict, out: RunOutput, suffix: str = "") -> dict:
    """``paired_differences.png`` and ``metrics.png``: one panel per headline family, titled
    with its measure and unit (:mod:`fedsim.results.display`); rows named by their group and
    what tells them apart. Returns the figures drawn, by name."""
    s = comparison["settings"]
    paired: dict[str, list[dict]] = {f: [] for f in comparison["families"]}  # the families' order
    against: dict[str, set[str]] = {
        f: set() for f in comparison["families"]
    }  # a family may hold both kinds
    for p in comparison["paired"] + comparison["contrasts"]:
        paired[p["family"]].append({**p, "name": _row_name(p["label"], p["metric"], p["family"])})
        against[p["family"]].add("its null" if "null" in p else str(s["baseline"]))
    over: dict[str, list[dict]] = {f: [] for f in comparison["families"]}
    for g in comparison["groups"]:
        for m, d in g["metrics"].items():
            over[d["family"]].append({**d, "name": _row_name(g["label"], m, d["family"])})
    seeds = max((d["n"] for g in comparison["groups"] for d in g["metrics"].values()), default=0)
    figures = {}
    for name, rows, xlabel, zero, title in (
        (
            "paired_differences",
            paired,
            lambda f: f"difference against {' or '.join(sorted(against[f]))} ({_unit(f)})",
            True,
            f"Paired differences per seed against {s['baseline'] or 'the null'}",
        ),
        (
            "metrics",
            over,
            lambda f: f"mean over seeds ({_unit(f)})",
            False,
            f"Headline metrics over {seeds} seeds",
        ),
    ):
        rows = dict([(f, r) for f, r in rows.items() if r][:MAX_PANELS])
        if rows:
            fig, axes, save = out.panels(f"{name}{suffix}", [len(r) for r in rows.values()])
            fig.suptitle(
                _plot_text(title, TICK_CHARS * 2), fontsize=FONT["title"] + 1, parse_math=False
            )
            _forest(axes, rows, xlabel, zero, s["level"])
            save()
            figures[name] = fig
    return figures


def _apart(metric: str, family: str) -> str:
    """What tells ``metric`` apart from the others of its family: the components its family's
    pattern leaves open (``routers.*.overall.ehr``: "fedmix"), else its context
    (:func:`fedsim.results.display.context`: a family named by a last component)."""
    found = path_pattern(family).fullmatch(metric)
    return ", ".join(found.groups()) if found and found.groups() else context(metric)


def _what(metric: str, family: str) -> str:
    """``metric`` in a reader's words: its family's measure, and what sets it apart."""
    apart = _apart(metric, family)
    return f"{apart}: {measure(family).name}" if apart else measure(family).name


def _row_name(group: str, metric: str, family: str) -> str:
    """A plot row: its group's overrides (none when every run is one group) and what tells the
    metric apart from the others of its panel (the panel's title names the measure)."""
    parts = [p for p in (group if group != "(all runs)" else "", _apart(metric, family)) if p]
    return " ".join(parts) or "all runs"


def _family_title(family: str) -> str:
    """A panel's title: the family's measure and unit, after what its pattern fixes besides
    (``rlhf.head_to_head.*.*.win_rate``: "head_to_head: win rate (win rate, 0 to 1)"), so two
    families of one measure read apart."""
    where = context(family)
    return f"{where}: {axis_label(family)}" if where else axis_label(family)


def _unit(family: str) -> str:
    return measure(family).unit or "value"


def _suffix(folder: Path, force: bool) -> str:
    """ "" when the comparison's files may be written as named (``--force``, or none exists),
    else the first free ``-N``: a comparison never replaces an earlier one silently."""
    if force or not any((folder / n).exists() for n in OUTPUTS):
        return ""
    k = 2
    while any((folder / _named(n, f"-{k}")).exists() for n in OUTPUTS):
        k += 1
    return f"-{k}"


def _named(name: str, suffix: str) -> str:
    stem, _, ext = name.rpartition(".")
    return f"{stem}{suffix}.{ext}"


def build(
    folder: str | Path, settings: Sweep, strict: bool = True, earlier_looks: tuple[int, ...] = ()
) -> dict:
    """The comparison of the runs under ``folder``; writes nothing (refusals happen here)."""
    runs = load_runs(folder)
    if not runs:
        raise ComparisonRefused(
            f"no completed run (a {POINT_FILE} beside a results.json) under {folder}"
        )
    return compare(runs, settings, strict, earlier_looks)


def write(
    folder: str | Path,
    settings: Sweep,
    output: str | Path | None = None,
    force: bool = False,
    strict: bool = True,
    earlier_looks: tuple[int, ...] = (),
) -> tuple[dict, list[Path]]:
    """Compare the runs under ``folder`` and write ``summary.md``, ``comparison.json`` and the
    plots to ``output`` (default: ``folder``), under new names (``summary-2.md``...) when an
    earlier comparison is there, unless ``force``. Returns the comparison and the files written."""
    result = build(folder, settings, strict, earlier_looks)
    out = RunOutput(output or folder)
    suffix = _suffix(out.path, force)
    if folders := [
        str(out.path / _named(n, suffix))
        for n in OUTPUTS
        if (out.path / _named(n, suffix)).is_dir()
    ]:
        raise ComparisonRefused(
            f"{', '.join(folders)} is a folder, where the comparison writes a file"
        )
    write_file(out.path / _named("summary.md", suffix), summary_markdown(result))
    write_file(out.path / _named("comparison.json", suffix), json.dumps(result, indent=1))
    plot(result, out, suffix)
    return result, [p for p in (out.path / _named(n, suffix) for n in OUTPUTS) if p.is_file()]


def run_headline(results: dict, settings: Sweep) -> str:
    """A single run's summary.md lead: its headline metrics (``sweep.metrics``) in a reader's
    words, then the verdict of each paired and contrast row the experiment's sweep settings judge,
    from this one run (:func:`compare` over it: the run's own interval, ``sweep.run_intervals``,
    where the experiment has one; else no claim from one seed)."""
    try:
        comparison = compare([Run("run", {}, flatten(results))], settings, strict=False)
    except ComparisonRefused as exc:
        return f"## Headline\n\nNo headline: {markdown_text(exc)}"
    (values,) = [g["metrics"] for g in comparison["groups"]]  # one run: one group
    rows = [
        {"what": _what(m, values[m]["family"]), "value": values[m]["mean"], "metric": m}
        for ms in comparison["families"].values()  # sweep.metrics' order
        for m in ms
        if m in values
    ]
    if not rows:
        return "## Headline\n\nNo headline metric (sweep.metrics) in this run's results."
    return (
        "## Headline\n\n"
        + markdown_table(rows, ["what", "value", "metric"])
        + "\n\n"
        + _run_verdicts(comparison)
    )


def _run_verdicts(comparison: dict) -> str:
    """One run's verdicts: the rows with an interval (the run's own, ``sweep.run_intervals``);
    the others are counted, as one seed supports no claim about them."""
    judged = [p for p in comparison["paired"] + comparison["contrasts"] if p["ci"] is not None]
    unjudged = len(comparison["paired"]) + len(comparison["contrasts"]) - len(judged)
    note = (
        f"\n\n{unjudged} other differences: no claim from one run (no interval of their own; "
        "a sweep over seeds, `fedsim compare`, gives one)."
        if unjudged
        else ""
    )
    if not judged:
        why = "" if unjudged else ": the experiment states no baseline and no contrast"
        return f"### Verdicts (this run alone)\n\nNo verdict{why}." + note
    table = _verdicts({**comparison, "paired": judged, "contrasts": []})
    return table.replace("## Verdicts", "### Verdicts (this run alone)") + note


def lead_with(summary: str, section: str) -> str:
    """``summary`` with ``section`` right after its title (its first ``# `` line), or first."""
    lines = summary.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if at is None:
        return f"{section}\n\n{summary}"
    return "\n".join([*lines[: at + 1], "", section, *lines[at + 1 :]])
