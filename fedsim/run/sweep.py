"""``fedsim run -m KEY=a,b seed=range(0,5) ...``: Hydra's multirun syntax, one ``fedsim run``
after another into one sweep folder, then the comparison (``fedsim/results/comparison.py``).

Each point runs as its own ``fedsim run`` process (its own private SuperLink, as a single run),
so a point that fails or is killed leaves the others intact. Hydra's override grammar expands the
sweep (ranges, choices, globs: ``OverridesParser``); its launcher is not used because a point
is a whole Flower run with its own processes, journal and results, not a function call.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from fedsim import progress
from fedsim.config.compose import ConfigError
from fedsim.config.data import who_else_writes
from fedsim.config.schema import protocol_of, typed_sweep
from fedsim.results import comparison, provenance
from fedsim.results.mlflow_sink import SweepRun
from fedsim.results.outputs import escape_controls, write_file

MANIFEST = "sweep.json"
INTERRUPTED = (130, 143)  # SIGINT / SIGTERM stopped the point: the sweep stops too


def expand(overrides: list[str]) -> tuple[list[list[str]], list[str]]:
    """(points, swept keys): the cartesian product of the sweep overrides (first key outermost),
    each point the full override list; constant overrides are kept as written."""
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as exc:
        raise ConfigError(f"sweep overrides do not parse: {exc}") from exc
    axes, swept = [], []
    for item, raw in zip(parsed, overrides):
        if item.is_sweep_override():
            key = item.get_key_element()
            axes.append([f"{key}={v}" for v in item.sweep_string_iterator()])
            swept.append(key)
        else:
            axes.append([raw])
    return [list(p) for p in itertools.product(*axes)], swept


def point_name(point: list[str], swept: list[str]) -> str:
    """A run's folder name: its swept overrides as ``seed-0__protocol.lr-0.1``, in characters that
    need no quoting in a Hydra override (the folder is passed on as ``results_dir=``)."""
    values = _swept_values(point, swept)
    return (
        "__".join(re.sub(r"[^A-Za-z0-9._-]", "_", f"{k}-{v}") for k, v in values.items()) or "run"
    )


def _swept_values(point: list[str], swept: list[str]) -> dict[str, str]:
    return {k: v for k, _, v in (o.partition("=") for o in point) if k in swept}


def _passable(folder: Path) -> Path:
    """``folder``, refused unless Hydra reads ``results_dir=<folder>`` back as that plain string:
    each point is passed on so (:meth:`Sweep._run_point`), and a record unpacked under its own
    name, ``x${oc.env:TOKEN}``, had its points run in ``x<the token>``, outside the sweep folder
    (the token in their config.yaml); a comma or a quote failed every point."""
    try:
        value = OverridesParser.create().parse_override(f"results_dir={folder}").value()
    except Exception:
        value = None
    if value != str(folder) or OmegaConf.is_interpolation(
        OmegaConf.create({"folder": value}), "folder"
    ):
        raise ConfigError(
            f"sweep folder {str(folder)!r}: Hydra reads it otherwise as each point's results_dir= "
            "(an interpolation, a comma, a quote, a bracket, a character outside ASCII...); rename it"
        )
    return folder


def _sweep_folder(overrides: list[str], first_cfg) -> Path:
    given = [o.partition("=")[2] for o in overrides if o.startswith("results_dir=")]
    if given:
        return Path(given[-1])
    return Path(first_cfg.results_dir).parent / f"sweep-{Path(first_cfg.results_dir).name}"


class Sweep:
    """The points, the folder and the manifest of one sweep."""

    def __init__(self, overrides: list[str], prepare):
        """``prepare`` composes and checks one point (``fedsim.run.cli.prepare``): every point is
        checked before the first runs, so a wrong key or value anywhere is refused up front."""
        folder = [o.partition("=")[2] for o in overrides if o.startswith("resume=")]
        self.points, self.swept = expand(
            [o for o in overrides if not o.startswith(("resume=", "results_dir="))]
        )
        checked = []
        for point in self.points:
            try:
                checked.append(prepare(point)[0])
            except Exception as exc:
                raise ConfigError(f"sweep point {' '.join(point)}:\n{exc}") from exc
        self.folder = _passable(
            refuse_other_writers(
                folder[-1] if folder else _sweep_folder(overrides, checked[0]),
                "sweep folder",
                inside=True,
            )
        )  # a record: someone else's files
        self.settings = typed_sweep(checked[0].sweep)  # the plan's defaults filled in
        self.strict = any(
            o.startswith("sweep.metrics=") for o in overrides
        )  # the user's patterns must match
        self.methods = sorted({m for c in checked for m in method_names(c)})
        check_against_experiment(self.settings, self.points, self.methods, overrides)
        self.first = checked[0]  # where the points' MLflow runs go (logging.*, protocol.name)
        self.session = {
            "git": provenance.git_state(),
            **provenance.environment(),
            "command": provenance.command(["fedsim", "run", "-m", *overrides]),
            "started": provenance.now(),
        }
        self.manifest = self._manifest(bool(folder))

    def _manifest(self, resume: bool) -> dict:
        path = self.folder / MANIFEST
        if resume:
            if not path.is_file():
                raise ConfigError(f"resume: {path} not found (no sweep in {self.folder})")
            manifest = comparison.read_json(path)  # a record's file: someone else's
            refuse_changed_plan(
                path, manifest, self.settings.planned()
            )  # before the points: they hold the plan
            try:
                points = [r["overrides"] for r in manifest["runs"]]
                if not all("status" in r for r in manifest["runs"]):
                    raise TypeError("a run without a status")
                if not isinstance(manifest.get("resumed", []), list):
                    raise TypeError("resumed is not a list")
            except (TypeError, KeyError) as exc:
                raise ConfigError(
                    f"resume: {path} is not a sweep's manifest (runs with overrides and a status, "
                    f"resumed sessions in a list): {exc}"
                ) from exc
            if points != self.points:
                raise ConfigError(
                    f"resume: these overrides expand to other points than the sweep in "
                    f"{self.folder} ({len(self.points)} vs {len(manifest['runs'])}); "
                    f"repeat the sweep's own overrides"
                )
            self._check_names(manifest["runs"])
            earlier_looks(manifest)  # refused now, not at the comparison after the runs
            manifest.setdefault("resumed", []).append(self.session)
            return manifest
        if path.exists():
            raise ConfigError(
                f"{self.folder} already holds a sweep; resume={self.folder} continues it"
            )
        runs = [
            {"name": point_name(p, self.swept), "overrides": p, "status": "pending"}
            for p in self.points
        ]
        names = [r["name"] for r in runs]
        if len(set(names)) != len(names):
            raise ConfigError("two sweep points would share a folder (repeated values?)")
        self._check_names(runs)
        return {
            "swept": self.swept,
            "provenance": self.session,
            "plan": plan_record(self.settings.planned()),
            "looks": [],
            "runs": runs,
        }

    def _check_names(self, runs: list[dict]) -> None:
        """Each point's folder is the one the sweep names from its overrides (:func:`point_name`),
        inside the sweep folder: a resumed manifest is a record's file, someone else's, and a
        name it gives (``../../x``, an absolute path) had the point written and run elsewhere."""
        for index, entry in enumerate(runs, 1):
            name = point_name(entry["overrides"], self.swept)
            if entry.get("name") != name:
                raise ConfigError(
                    f"{self.folder / MANIFEST} entry {index} names its folder {entry.get('name')!r}, "
                    f"but its overrides make {name!r}: a point runs only in the folder the sweep names"
                )
            if (self.folder / name).resolve().parent != self.folder:
                raise ConfigError(
                    f"{self.folder / MANIFEST} entry {index}: its folder {name!r} is not inside "
                    f"{self.folder}"
                )

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_file(self.folder / MANIFEST, json.dumps(self.manifest, indent=1))

    def run(self) -> int:
        """Every point not yet completed, in order; returns 0 if all completed, 1 if any
        failed, the signal's exit code if one stopped the sweep."""
        self.parent = self._mlflow_parent()
        self.folder.mkdir(parents=True, exist_ok=True)
        if why := who_else_writes(
            self.folder
        ):  # made by another user between the check and this mkdir
            raise PermissionError(f"sweep folder: {why}")
        self.save()
        try:
            code = self._run_all()
        finally:
            self.session["ended"] = provenance.now()
            self.save()
        return code

    def _run_all(self) -> int:
        todo = [r for r in self.manifest["runs"] if r["status"] != "completed"]
        start, done = time.monotonic(), 0
        print(
            f"fedsim: sweep of {len(self.points)} runs in {self.folder} "
            f"({len(self.points) - len(todo)} already completed)",
            flush=True,
        )
        for entry in todo:
            code = self._run_point(entry, len(self.points))
            done += 1
            completed = sum(r["status"] == "completed" for r in self.manifest["runs"])
            print(
                f"fedsim: sweep {entry['status']}: {entry['name']} ({entry['seconds']:.0f} s); "
                + progress.line(
                    "sweep",
                    done,
                    len(todo),
                    time.monotonic() - start,
                    "runs",
                    f"{completed}/{len(self.points)} completed",
                ),
                flush=True,
            )
            if entry["status"] == "completed" and self.parent is not None:
                self.parent.adopt(self.folder / entry["name"])
            if code in INTERRUPTED:
                if self.parent is not None:
                    self.parent.stop()
                print(
                    f"fedsim: sweep interrupted; `fedsim run -m ... resume={self.folder}` continues it",
                    file=sys.stderr,
                )
                return code
        result = self.compare()
        failed = [r["name"] for r in self.manifest["runs"] if r["status"] != "completed"]
        if failed:
            print(
                f"fedsim: sweep: {len(failed)} runs failed: {', '.join(failed)} (errors in {MANIFEST})",
                file=sys.stderr,
            )
        if self.parent is not None:
            self.parent.close(
                _paired_means(result),
                [self.folder / n for n in comparison.OUTPUTS if (self.folder / n).is_file()],
                time.time(),
                bool(failed),
            )
        return 1 if failed or result is None else 0

    def _mlflow_parent(self) -> SweepRun | None:
        """With logging.mlflow: the sweep's MLflow run (its id kept in the manifest for a resume)."""
        if not self.first.logging.mlflow:
            return None
        parent = SweepRun(
            self.first.logging.mlflow_dir,
            self.first.protocol.name,
            self.folder,
            self.manifest.get("mlflow_run_id"),
            self.manifest["provenance"],
            {
                "sweep.command": self.session["command"]["line"][:6000],
                "sweep.swept": ",".join(self.swept),
                "sweep.points": str(len(self.points)),
            },
        )
        self.manifest["mlflow_run_id"] = parent.run_id
        return parent

    def _run_point(self, entry: dict, total: int) -> int:
        folder = self.folder / entry["name"]
        index = self.manifest["runs"].index(entry) + 1
        print(f"fedsim: sweep run {index}/{total}: {' '.join(entry['overrides'])}", flush=True)
        killed = (folder / "checkpoint" / "run.json").is_file() and not (
            folder / "results.json"
        ).exists()
        args = [f"resume={folder}"] if killed else [*entry["overrides"], f"results_dir={folder}"]
        folder.mkdir(parents=True, exist_ok=True)
        write_file(
            folder / comparison.POINT_FILE,
            json.dumps(
                {
                    "overrides": entry["overrides"],
                    "swept": _swept_values(entry["overrides"], self.swept),
                },
                indent=1,
            ),
        )
        began = time.monotonic()
        # appended to (a resumed point's log keeps its first part), never through a link
        log_fd = os.open(
            folder / "fedsim.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666
        )
        with os.fdopen(log_fd, "ab") as log:
            # -P: not the working folder first on the path, where another local user may have
            # planted a fedsim package (a sweep started from /tmp)
            child = subprocess.Popen(
                [sys.executable, "-P", "-m", "fedsim.run.cli", "run", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            with _forwarding(child) as received:
                code = exit_code(child.wait(), received)
        entry["seconds"] = time.monotonic() - began
        entry["status"] = (
            "completed" if code == 0 else "interrupted" if code in INTERRUPTED else "failed"
        )
        entry["exit_code"] = code
        entry["error"] = None if code == 0 else _tail(folder / "fedsim.log")
        self.save()
        return (
            128 + received[0] if received else code
        )  # told to stop: the sweep stops, the point done or not

    def compare(self) -> dict | None:
        """The sweep's own comparison (replacing its earlier one, e.g. before a resume); None
        when it is refused (the runs stay; ``fedsim compare`` with other settings rebuilds it)."""
        if not any(r["status"] == "completed" for r in self.manifest["runs"]):
            return {"paired": []}
        try:
            result, _ = comparison.write(
                self.folder,
                self.settings,
                force=True,
                strict=self.strict,
                earlier_looks=earlier_looks(self.manifest),
                methods=self.methods,
            )
        except comparison.ComparisonRefused as exc:
            why = escape_controls(exc, keep="\n")  # the record's names, to a terminal
            print(
                f"fedsim: sweep comparison refused: {why}\n`fedsim compare {self.folder} sweep.KEY=...` "
                "builds it with other settings",
                file=sys.stderr,
            )
            return None
        count_look(self.manifest, result)
        self.save()
        for warning in result["warnings"]:
            print(f"fedsim: sweep comparison: warning: {escape_controls(warning)}", file=sys.stderr)
        print(
            f"fedsim: sweep comparison in {self.folder / 'summary.md'} and comparison.json",
            flush=True,
        )
        return result


def plan_record(plan: dict | None) -> dict | None:
    """``sweep.plan`` as sweep.json keeps it: its settings and the SHA-256 of their canonical JSON
    (sorted keys, no spaces), written before the first run."""
    if plan is None:
        return None
    canonical = json.dumps(plan, sort_keys=True, separators=(",", ":"))
    return {"settings": plan, "sha256": hashlib.sha256(canonical.encode()).hexdigest()}


def refuse_changed_plan(path: Path, manifest: dict, plan: dict | None) -> None:
    """Refuse a resume or a comparison whose ``sweep.plan`` is not the one hashed into the
    manifest ``path`` before the first run (added, dropped or changed), or whose manifest plan no
    longer matches its own hash: a plan chosen after seeing results is no plan."""
    kept = manifest.get("plan") if isinstance(manifest, dict) else None
    if kept is not None and (
        not isinstance(kept, dict) or plan_record(kept.get("settings")) != kept
    ):
        raise ConfigError(
            f"{path}: its plan does not match its own sha256: the manifest was edited"
        )
    if (kept or {}).get("sha256") != (plan_record(plan) or {}).get("sha256"):
        raise ConfigError(
            f"sweep.plan {json.dumps(plan)} is not the plan {path} holds from before the first run "
            f"({json.dumps(kept and kept['settings'])}): a plan cannot change once the sweep has run"
        )


def earlier_looks(manifest: dict) -> tuple[int, ...]:
    """The seed counts at which the sweep's comparison was read before (``looks`` in sweep.json),
    refused when they are not a list of ``{"n": count, ...}`` (a record's file: someone else's)."""
    looks = manifest.get("looks", [])
    if not isinstance(looks, list) or not all(
        isinstance(look, dict) and type(look.get("n")) is int for look in looks
    ):
        raise ConfigError(
            f"sweep.json: its looks are not a list of {{\"n\": seeds, ...}}: {str(looks)[:200]}"
        )
    return tuple(look["n"] for look in looks)


def count_look(manifest: dict, result: dict) -> bool:
    """Add the comparison's look (seeds read, its status and boundary) to the manifest's looks,
    once per seed count: reading the same seeds again spends nothing more. True when added."""
    look = result.get("look")
    if look is None or look["n"] in earlier_looks(manifest):
        return False
    manifest.setdefault("looks", []).append(
        {
            "n": look["n"],
            "status": look["status"],
            "boundary_z": look["boundary_z"],
            "at": provenance.now(),
        }
    )
    return True


def record_look(path: Path, manifest: dict, result: dict) -> None:
    """:func:`count_look`, written to the manifest ``path`` when it is a new look."""
    if count_look(manifest, result):
        write_file(path, json.dumps(manifest, indent=1))


def read_manifest(folder: Path) -> tuple[Path, dict] | None:
    """The sweep.json in ``folder`` and its content, None when there is none."""
    path = folder / MANIFEST
    if not path.is_file():
        return None
    manifest = comparison.read_json(path)  # a record's file: someone else's
    if not isinstance(manifest, dict):
        raise ConfigError(f"{path} is not a sweep's manifest (not a JSON object)")
    return path, manifest


def refuse_other_writers(folder: str | Path, what: str, inside: bool = False) -> Path:
    """``folder`` resolved, refused when another local user could write it (``who_else_writes``):
    they could plant a link or swap a file between fedsim's checks and its reads and writes there.
    Checked as named too (a link on the way, in a folder others can write, could be repointed
    after the check: the resolved path is the one to use), and with ``inside`` every folder in it
    (a record unpacked with its modes may hold one that others can write), which must hold no
    link either (``comparison.refuse_links``)."""
    named = Path(folder).expanduser().absolute()
    resolved = named.resolve()
    why = who_else_writes(named) or who_else_writes(resolved)
    if not why and inside and resolved.exists():
        why = next(filter(None, map(_shared, comparison.refuse_links(resolved)[1:])), None)
    if why:
        raise ConfigError(
            f"{what} {folder}: {why}, so another user could plant links in it or swap its files: "
            "choose a folder only you (and root) can write"
        )
    return resolved


def _shared(folder: Path) -> str | None:
    """Why another user could swap an entry of ``folder``, a folder inside a record: what
    ``who_else_writes`` says, and a sticky folder others can write too, which it lets pass as
    /tmp: an entry another user makes there after the checks stays theirs, to swap for a link."""
    mode = folder.stat().st_mode
    return (
        f"{folder} is writable by others ({stat.filemode(mode)})"
        if mode & 0o022
        else who_else_writes(folder)
    )


def _paired_means(result: dict | None) -> dict[str, float]:
    """The sweep's paired mean differences and contrasts (minus their null) as MLflow metrics
    ``paired/<group>/<metric>`` and ``contrast/<group>/<metric>``."""
    result = result or {}
    return {
        f"{kind}/{p['label']}/{p['metric']}"[:250]: p["mean"]
        for kind, key in (("paired", "paired"), ("contrast", "contrasts"))
        for p in result.get(key, [])
    }


def method_names(cfg) -> list[str]:
    """The arms a point's results name (its protocol's ``method_names``)."""
    return protocol_of(cfg).method_names()


def recorded_methods(config) -> list[str] | None:
    """The arms a recorded run names, from its config.yaml; None where that config has no
    protocol block that types today (a record of an older fedsim): the comparison then reads
    candidates off the results' paths."""
    try:
        return method_names(config)
    except Exception:  # any refusal of an old or partial config: fall back, never fail the compare
        return None


def check_against_experiment(
    settings, points: list[list[str]], methods: list[str], overrides: list[str]
) -> None:
    """The sweep settings against the experiment, before any run, naming the valid choices: the
    baseline (and each effect of interest's) is one of the experiment's ``methods`` or
    ``KEY=VALUE`` of a key swept over two or more values; with headline metrics named, every
    primary endpoint names one of them, and so does every contrast and effect of interest the
    command line sets (the comparison judges headline metrics only; an experiment's own entry
    for a metric left out of a narrowed ``sweep.metrics`` is named in the summary instead)."""
    swept = _swept_choices(points)
    choices = (
        f"methods of this experiment: {', '.join(methods) or '(none: its results name no arms)'}"
        f"; or KEY=VALUE of a key the sweep varies: {swept or '(none varies)'}"
    )
    for key, baseline in [
        ("sweep.baseline", settings.baseline),
        *(
            (f"sweep.effect_of_interest[{i}].baseline", e.baseline)
            for i, e in enumerate(settings.effect_of_interest)
            if e.baseline != comparison.CONTRAST_BASELINE
        ),
    ]:
        if baseline is None:
            continue
        name, sep, value = baseline.partition("=")
        if sep:
            values = [v for k, vs in _swept_values_by_key(points).items() if k == name for v in vs]
            if len(values) < 2 or value not in values:
                raise ConfigError(
                    f"{key}={baseline}: the sweep gives {name} the values {values or 'none'}; "
                    f"the baseline must be one of two or more swept values. Choices: {choices}"
                )
        elif name not in methods:
            raise ConfigError(
                f"{key}={baseline} names no arm of this experiment. Choices: {choices}"
            )
    if not settings.metrics:  # every number is a headline metric: nothing to check against
        return
    given = lambda key: any(o.startswith(f"sweep.{key}") for o in overrides)  # noqa: E731
    named = [
        *((f"sweep.plan.primary[{i}]", p) for i, p in enumerate(settings.plan.primary)),
        *(
            (f"sweep.contrasts[{i}].metric", c.metric)
            for i, c in enumerate(settings.contrasts)
            if given("contrasts")
        ),
        *(
            (f"sweep.effect_of_interest[{i}].metric", e.metric)
            for i, e in enumerate(settings.effect_of_interest)
            if given("effect_of_interest")
        ),
    ]
    for key, pattern in named:
        if not any(_overlap(pattern, m) for m in settings.metrics):
            raise ConfigError(
                f"{key}={pattern} matches none of the headline metrics, the only ones a "
                f"comparison judges; sweep.metrics: {', '.join(settings.metrics)}"
            )


def _overlap(pattern: str, other: str) -> bool:
    """Whether two results path patterns can match one path (each read as a path by the other;
    ``*`` is a character a path component may hold)."""
    return bool(
        comparison.path_pattern(pattern).fullmatch(other)
        or comparison.path_pattern(other).fullmatch(pattern)
    )


def _swept_values_by_key(points: list[list[str]]) -> dict[str, list[str]]:
    by_key: dict[str, set[str]] = {}
    for point in points:
        for key, _, value in (o.partition("=") for o in point):
            by_key.setdefault(key, set()).add(value)
    return {k: sorted(vs) for k, vs in by_key.items() if len(vs) > 1}


def _swept_choices(points: list[list[str]]) -> str:
    return "; ".join(f"{k}={'|'.join(vs)}" for k, vs in _swept_values_by_key(points).items())


def exit_code(code: int, received: list[int]) -> int:
    """A point's exit code as the sweep reads it: when the sweep was told to stop (``received``
    signals) and the point did not complete, it was interrupted, whatever it exited with: a
    point still starting dies of the forwarded signal (-15) before its own handler turns it into
    143, and read as a failure the sweep went on to the next point."""
    return 128 + received[0] if received and code != 0 else code


@contextmanager
def _forwarding(child: subprocess.Popen):
    """SIGINT / SIGTERM to the sweep go to the running point (its own session, so a terminal's
    Ctrl-C reaches it once), which stops its run cleanly and exits 130 / 143; the sweep then
    stops too. Nothing is left running, and the point can be resumed. Yields the signals received."""
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        child.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _tail(path: Path, lines: int = 20, limit: int = 1 << 16) -> str:
    """The log's last ``lines`` lines, from its last ``limit`` bytes: a point's log in a record
    may be of any size (a sparse one of 10 GiB is nothing on disk), and was read whole."""
    with open(path, "rb") as fh:
        fh.seek(max(0, fh.seek(0, os.SEEK_END) - limit))
        return "\n".join(fh.read().decode(errors="replace").splitlines()[-lines:])
