"""Every number a page marks is rebuilt from its record under records/, so a page cannot drift
from the runs behind it: README.md, docs/clock.md, docs/secure-aggregation.md,
docs/benchmarks/simulation-peers.md and docs/methods/*.md are scanned for markers, each marker's
number recomputed, and any difference at the printed precision fails.

A marker is an HTML comment (invisible when rendered) right after the number it holds:

- ``<!-- record: RUN PATH -->``: the value at ``PATH`` (dotted; a list index is a number) of the
  ``results.json`` in the run folder ``RUN``, e.g.
  ``+0.0031 <!-- record: records/fedtp_paper-58/run ehr_gain -->``; ``RUN`` may instead name a
  JSON file kept as a record (a bench's output), e.g.
  ``records/fedbiscuit_populations_length/populations.json summary.second_criterion/majority.ci.0``;
- ``<!-- record: SWEEP compare OVERRIDE... METRIC FIELD -->``: the field ``FIELD`` (dotted:
  ``mean``, ``ci.0``, ``ci.1``, ``p_value``, ``p_holm``, ``mde``) of the paired or contrast row
  of ``METRIC`` in the comparison ``fedsim compare SWEEP OVERRIDE...`` builds
  (:func:`fedsim.results.comparison.compare`, in process, writing nothing; a metric that is both
  a paired row and a contrast, FedBiscuit U=3's gap minus FedBis's and minus 0, names the paired
  row). ``SWEEP`` may join
  several record folders with ``+`` (a sweep kept in parts: their runs compared together);
- ``<!-- record: SWEEP compare OVERRIDE... over-seeds METRIC FIELD -->``: the same comparison's
  ``METRIC`` over seeds in its one group (a method's mean over seeds and its interval, not a
  difference: ``FIELD`` ``mean``, ``ci.0``, ``ci.1``, ``std``), e.g.
  ``records/fede4rag_arms-39+records/fede4rag_arms-39-more compare over-seeds methods.vanilla.test.ndcg@10 mean``.
  Tokens are split as a shell would; ``$NAME`` is a ``NAME=value`` line of a shell block of the
  scanned pages (one value across them), so a marker states the page's own compare line.

The number is the one just before the marker: its sign, decimals, thousands commas and a ``%``
(the value times 100) are read as printed, and the value must round to it.
"""

from __future__ import annotations

import json
import re
import shlex
from functools import cache
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fedsim.config.compose import CONF_DIR
from fedsim.config.data import REPO_ROOT
from fedsim.config.schema import typed_sweep
from fedsim.results.comparison import compare, counted_runs, load_runs, read_config

PAGES = [
    REPO_ROOT / "README.md",
    REPO_ROOT / "docs" / "clock.md",
    REPO_ROOT / "docs" / "secure-aggregation.md",
    REPO_ROOT / "docs" / "benchmarks" / "simulation-peers.md",
    *sorted((REPO_ROOT / "docs" / "methods").glob("*.md")),
]
MARKER = re.compile(r"<!--\s*record:\s*(.*?)\s*-->", re.S)
NUMBER = re.compile(r"([+-]?)(\d[\d,]*(?:\.(\d+))?)(%?)\s*$")
ASSIGN = re.compile(r"^([A-Za-z_]\w*)=(.*)$", re.M)


class MarkerError(ValueError):
    """A marker that names no record, no value there, or a number the value does not print as."""


def page_variables(pages=PAGES) -> dict[str, str | None]:
    """``NAME=value`` lines of the pages' fenced blocks, unquoted; None for a name given two values
    (or a value that is not shell words)."""
    found: dict[str, str | None] = {}
    for page in pages:
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", page.read_text(), re.S | re.M):
            for name, value in ASSIGN.findall(block):
                try:
                    value = " ".join(shlex.split(value))
                except (
                    ValueError
                ):  # not one shell word (a line of a script): no value a marker can use
                    value = None
                found[name] = value if found.get(name, value) == value else None
    return found


def dig(value, path: str):
    """The value at a dotted path (a list or tuple index is a number)."""
    for key in path.split("."):
        try:
            value = (
                value[int(key)] if isinstance(value, (list, tuple)) else value[key]
            )  # a primary CI: a tuple
        except (KeyError, IndexError, ValueError, TypeError):
            raise MarkerError(f"no {path!r} (at {key!r})") from None
    return value


def _folder(name: str) -> Path:
    folder = REPO_ROOT / name
    if not name.startswith("records/") or not folder.is_dir():
        raise MarkerError(f"no record folder {name} (a record lives under records/)")
    return folder


def _record_file(name: str) -> Path:
    path = REPO_ROOT / name
    if not name.startswith("records/") or not path.is_file():
        raise MarkerError(f"no record file {name} (a record lives under records/)")
    return path


@cache
def comparison(folders: str, overrides: tuple[str, ...]) -> dict:
    """The comparison ``fedsim compare`` builds for these folders and overrides: the sweep settings
    of the first folder's first run, then the overrides (as ``fedsim.run.cli.compare``)."""
    paths = [_folder(f) for f in folders.split("+")]
    first = next((r for r in counted_runs(paths[0]) if (r / "config.yaml").is_file()), None)
    if first is None:
        raise MarkerError(f"no completed sweep run under {paths[0]}")
    defaults = OmegaConf.load(CONF_DIR / "config.yaml").sweep
    given = OmegaConf.from_dotlist([o.removeprefix("sweep.") for o in overrides])
    settings = typed_sweep(defaults, read_config(first / "config.yaml").get("sweep", {}), given)
    return compare(
        [run for p in paths for run in load_runs(p)],
        settings,
        strict=any(o.startswith("sweep.metrics=") for o in overrides),
    )


def rebuild(marker: str, variables: dict[str, str | None]) -> float:
    """The value a marker names, from its record."""

    def expand(token):
        if token.startswith("$"):
            if variables.get(token[1:]) is None:
                raise MarkerError(f"{token} is no NAME=value line of the pages (or has two values)")
            return variables[token[1:]]
        return token

    tokens = [expand(t) for t in shlex.split(marker)]
    if len(tokens) == 2:
        results = (
            _record_file(tokens[0])
            if tokens[0].endswith(".json")
            else _folder(tokens[0]) / "results.json"
        )
        if not results.is_file():
            raise MarkerError(f"no {results.relative_to(REPO_ROOT)}")
        return float(dig(json.loads(results.read_text()), tokens[1]))
    if len(tokens) < 4 or tokens[1] != "compare":
        raise MarkerError(
            f"a marker is RUN PATH or SWEEP compare OVERRIDE... METRIC FIELD, got {marker!r}"
        )
    over_seeds = len(tokens) >= 5 and tokens[-3] == "over-seeds"
    result = comparison(tokens[0], tuple(tokens[2 : -3 if over_seeds else -2]))
    if over_seeds:
        rows = [g["metrics"][tokens[-2]] for g in result["groups"] if tokens[-2] in g["metrics"]]
    else:
        rows = [r for r in result["paired"] if r["metric"] == tokens[-2]] or [
            r for r in result["contrasts"] if r["metric"] == tokens[-2]
        ]
    if len(rows) != 1:
        raise MarkerError(f"{len(rows)} rows of {tokens[-2]} in the comparison (one wanted)")
    return float(dig(rows[0], tokens[-1]))


def check(printed_before: str, value: float) -> None:
    """Raise unless ``value`` rounds to the number that ends ``printed_before``."""
    number = NUMBER.search(printed_before.rstrip("*"))
    if number is None:
        raise MarkerError(f"no number right before the marker: ...{printed_before[-30:]!r}")
    sign, digits, decimals, percent = number.groups()
    printed = float(digits.replace(",", "")) * (-1 if sign == "-" else 1)
    shown = value * 100 if percent else value
    places = len(decimals or "")
    if abs(shown - printed) > 0.5 * 10**-places + 1e-12 or (sign == "+" and shown < 0):
        raise MarkerError(
            f"{number.group(0).strip()} printed, the record gives {shown:.{places + 2}f}"
        )


def markers(pages=PAGES):
    """(page:line, text before the marker on its line, marker body) of every marker."""
    for page in pages:
        text = page.read_text()
        for m in MARKER.finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            where = f"{page.relative_to(REPO_ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            yield pytest.param(text[line_start : m.start()], m.group(1), id=where)


VARIABLES = page_variables()
FEDE4RAG_ARMS = (
    "records/fede4rag_arms-39+records/fede4rag_arms-39-more"  # a sweep kept in two parts
)


@pytest.mark.parametrize(("before", "marker"), list(markers()))
def test_marked_number_is_its_record(before, marker):
    check(before, rebuild(marker, VARIABLES))


@pytest.mark.parametrize(
    ("before", "marker", "why"),
    [
        (
            "EHR +0.0032 ",
            "records/fedtp_paper-58/run ehr_gain",
            "printed",
        ),  # record: 0.00314 -> +0.0031
        ("EHR -0.0031 ", "records/fedtp_paper-58/run ehr_gain", "printed"),  # the sign
        ("EHR 0.0031% ", "records/fedtp_paper-58/run ehr_gain", "printed"),  # percent: 0.314%
        ("EHR +0.0033 ", "records/fedtp_paper-57/run ehr_gain", "no record folder"),
        ("EHR +0.0033 ", "records/fedtp_paper-58/run ehr_gains", "no 'ehr_gains'"),
        (
            "EHR +0.0033 ",
            "records/fedtp_paper-58/run bootstrap_ci_ehr_gain.2",
            "no 'bootstrap_ci_ehr_gain.2'",
        ),
        (
            "EHR +0.0033 ",
            "records/fedtp_paper-58 ehr_gain",
            "no records/fedtp_paper-58/results.json",
        ),
        ("EHR +0.0033 ", "docs/methods ehr_gain", "no record folder"),
        (
            "+0.0658 ",
            "records/fedbiscuit_populations_length/population.json summary",
            "no record file",
        ),
        ("+0.0658 ", "pyproject.json summary", "no record file"),
        (
            "+0.0659 ",
            "records/fedbiscuit_populations_length/populations.json "
            "summary.second_criterion/majority.own_minus_pooled",
            "printed",
        ),
        ("EHR ", "records/fedtp_paper-58/run ehr_gain", "no number"),
        (
            "+0.039 ",
            "records/fedbiscuit_length-40 compare sweep.baseline=raw policy.fedbis.4.win_rat mean",
            "0 rows",
        ),
        (
            "+0.039 ",
            "records/fedbiscuit_length-40 compare sweep.baseline=raw $NO_SUCH policy.fedbis.4.win_rate mean",
            r"\$NO_SUCH",
        ),
        (
            "+0.040 ",
            "records/fedbiscuit_length-40 compare sweep.baseline=raw policy.fedbis.4.win_rate mean",
            "printed",
        ),
        (
            "0.464 ",
            f"{FEDE4RAG_ARMS} compare over-seeds methods.vanilla.test.ndcg@10 mean",
            "printed",
        ),
        (
            "0.463 ",
            f"{FEDE4RAG_ARMS} compare over-seeds methods.vanila.test.ndcg@10 mean",
            "0 rows",
        ),
        (
            "0.500 ",
            "records/fedbiscuit_length-40 compare sweep.baseline=fedbis over-seeds "
            "rlhf.reward_hacking.fedbis.0.proxy_win_rate ci.0",
            "no 'ci.0'",
        ),  # constant over seeds: no interval
    ],
)
def test_a_wrong_marker_fails(before, marker, why):
    """The checker can fail: a number off by one unit of its last digit, a wrong sign or scale, a
    missing record, run, key, index, row or variable each fail naming what is wrong."""
    with pytest.raises(MarkerError, match=why):
        check(before, rebuild(marker, VARIABLES))


def test_a_right_marker_passes():
    """The same checks pass on the values the record holds (the wrong ones above fail on their fault)."""
    check("EHR +0.0031 ", rebuild("records/fedtp_paper-58/run ehr_gain", VARIABLES))
    check("EHR 0.31% ", rebuild("records/fedtp_paper-58/run ehr_gain", VARIABLES))
    check(
        "1,058 ",
        rebuild("records/fedtp_paper-58/run bootstrap_ci_ehr_gain_unit.clusters", VARIABLES),
    )
    check(
        "+0.035 ",
        rebuild(
            'records/fedbiscuit_length-40 compare sweep.baseline=fedbis "$CONTRASTS" "$EFFECTS" '
            "rlhf.reward_hacking.fedbiscuit_u3.1.gap mean",
            VARIABLES,
        ),
    )  # paired; the contrast: +0.45
    check(
        "+0.0658 ",
        rebuild(
            "records/fedbiscuit_populations_length/populations.json "
            "summary.second_criterion/majority.own_minus_pooled",
            VARIABLES,
        ),
    )
    check(
        "+0.039 ",
        rebuild(
            "records/fedbiscuit_length-40 compare sweep.baseline=raw policy.fedbis.4.win_rate mean",
            VARIABLES,
        ),
    )
    check(
        "0.463 ",
        rebuild(f"{FEDE4RAG_ARMS} compare over-seeds methods.vanilla.test.ndcg@10 mean", VARIABLES),
    )
    check(
        "0.486 ",
        rebuild(f"{FEDE4RAG_ARMS} compare over-seeds methods.vanilla.test.ndcg@10 ci.1", VARIABLES),
    )


def test_the_pages_mark_their_numbers():
    """The README's Methods table marks its headline numbers (an unmarked page would pass vacuously)."""
    readme = [m for m in markers() if m.id.startswith("README.md")]
    assert len(readme) >= 3
