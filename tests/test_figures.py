"""Every figure fedsim writes, drawn from kept records (records/, read-only, compared or reported in
process), read as matplotlib objects as saved: a title on every panel, text of 8 pt or more at the
saved size and inside the figure, tick and axis labels of bounded length that are no raw results paths,
an interval drawn wherever a legend or title names one (never over fewer than 3 draws), and
every marker named in a legend."""

import json
import re
import sys

import numpy as np
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.lines import Line2D
from test_outputs import Kept
from test_records import comparison as record_comparison

from fedsim.config.data import REPO_ROOT
from fedsim.privacy.audit import AuditReport, Bound
from fedsim.results import comparison
from fedsim.results.curves import learning_curve
from fedsim.runtime.server_app import audit_section
from fedsim_experiments.fedbiscuit import report as fedbiscuit_report
from fedsim_experiments.feddtre import report as feddtre_report
from fedsim_experiments.fede4rag import report as fede4rag_report
from fedsim_experiments.fedtp import report as fedtp_report

sys.path.insert(0, str(REPO_ROOT / "bench"))  # the benches that draw docs/*.png
import fedbiscuit_hacking_curves  # noqa: E402
import feddtre_alpha_pooled  # noqa: E402

RECORDS = REPO_ROOT / "records"
TICK_CHARS, LABEL_CHARS = 60, 100
RAW_PATH = re.compile(r"\b[A-Za-z_]\w*(\.[A-Za-z_*]\w*){2,}")  # routers.fedmix.overall.ehr
NAMES_INTERVAL = re.compile(r"\bCI\b|(?<!no )interval")  # "no interval" names none


def _results(path: str) -> dict:
    return json.loads((RECORDS / path).read_text())


def _texts(fig):
    """(kind, Text) of every text drawn: titles, axis labels, ticks, legends, annotations."""
    fig.canvas.draw()  # tick labels are set at drawing
    if fig._suptitle is not None:
        yield "title", fig._suptitle
    for legend in fig.legends:
        yield from (("legend", t) for t in legend.get_texts())
    for ax in fig.axes:
        yield "title", ax.title
        yield from (("label", t) for t in (ax.xaxis.label, ax.yaxis.label))
        for t in ax.get_xticklabels() + ax.get_yticklabels():
            yield "tick", t
        if ax.get_legend():
            yield from (("legend", t) for t in ax.get_legend().get_texts())
        yield from (("annotation", t) for t in ax.texts)


def _legend_entries(fig) -> dict[str, object]:
    """Legend label -> its handle, of every axis' legend and the figure's."""
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    return {t.get_text(): h for lg in legends for t, h in zip(lg.get_texts(), lg.legend_handles)}


def _intervals(ax) -> dict[str, bool]:
    """Label -> whether it is drawn with some extent, of every error bar and band on ``ax``."""
    drawn = {}
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            segments = [np.asarray(seg) for col in c.lines[2] for seg in col.get_segments()]
            drawn[c.get_label()] = any(np.ptp(seg, axis=0).max() > 0 for seg in segments)
    for c in ax.collections:
        if isinstance(c, PolyCollection):
            extent = c.get_datalim(ax.transData)
            drawn[c.get_label()] = drawn.get(c.get_label()) or extent.height > 0
    return drawn


def check_figure(fig) -> None:
    """What the module docstring lists, for one figure."""
    texts = list(_texts(fig))
    for ax in fig.axes:
        assert ax.get_title() or fig._suptitle is not None, "a panel without a title"
        assert ax.get_xlabel() and ax.get_ylabel() or ax.get_yticklabels(), "unlabelled axes"
    for kind, t in texts:
        text = t.get_text()
        if not text or not t.get_visible():
            continue
        assert t.get_fontsize() >= 8, (kind, text, t.get_fontsize())
        if kind == "tick":
            assert len(text) <= TICK_CHARS, text
        if kind in ("label", "tick"):
            assert len(text) <= LABEL_CHARS and not RAW_PATH.search(text), (kind, text)
        if kind == "tick":  # a tick past the view limits is kept, not drawn
            continue
        box, page = t.get_window_extent(), fig.bbox
        assert (
            box.x0 >= page.x0 - 2
            and box.x1 <= page.x1 + 2
            and box.y0 >= page.y0 - 2
            and box.y1 <= page.y1 + 2
        ), f"{kind} {text!r} runs off the figure"
    entries = _legend_entries(fig)
    intervals = {}
    for ax in fig.axes:
        intervals.update({k: v or intervals.get(k, False) for k, v in _intervals(ax).items()})
    for label in entries:  # every captioned interval is drawn, as what the caption names
        if NAMES_INTERVAL.search(label):
            assert intervals.get(label), f"{label!r} names an interval that is not drawn"
    for ax in fig.axes:
        if NAMES_INTERVAL.search(ax.get_title()):
            assert any(_intervals(ax).values()), ax.get_title()
        parts = {
            id(a)
            for c in ax.containers
            if isinstance(c, ErrorbarContainer)
            for a in [c.lines[0], *c.lines[1], *c.lines[2]]
        }
        markers = [
            a.get_label()
            for a in [*ax.lines, *ax.collections]
            if id(a) not in parts
            and (
                (isinstance(a, Line2D) and a.get_marker() not in (None, "None", ""))
                or isinstance(a, PathCollection)
            )
        ]
        markers += [c.get_label() for c in ax.containers if isinstance(c, ErrorbarContainer)]
        unnamed = [m for m in markers if m not in entries]
        assert not unnamed, f"markers with no legend entry on {ax.get_title()!r}: {unnamed}"


def _check_all(figures: dict, expected: set[str]) -> None:
    assert set(figures) >= expected, set(figures)
    for name, fig in figures.items():
        try:
            check_figure(fig)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


@pytest.mark.parametrize(
    "record, overrides",
    [
        ("records/fedtp_seeds-58", ()),  # contrasts against their null, a plan
        (
            "records/fede4rag_arms-39",
            ("sweep.baseline=fedavg",),
        ),  # paired rows, effects of interest
        ("records/feddtre_power_pilot-41c", ("sweep.baseline=fedavg",)),
    ],
)
def test_every_comparison_figure_of_a_kept_record(record, overrides, tmp_path):
    out = Kept(tmp_path)
    figures = comparison.plot(record_comparison(record, overrides), out)
    assert figures == out.figures
    _check_all(
        figures, {"metrics"} | ({"paired_differences"} if overrides or "fedtp" in record else set())
    )
    titles = [ax.get_title() for fig in figures.values() for ax in fig.axes]
    assert not any("x:" in t or "effect of interest" in t for t in titles)


def test_a_hollow_point_is_explained_and_no_interval_is_claimed_for_it(tmp_path):
    """One seed: no interval over seeds; the points are hollow, and the legend says why."""
    result = record_comparison("records/fedtp_seeds-58", ())
    no_ci = [
        {**g, "metrics": {m: {**d, "ci": None} for m, d in g["metrics"].items()}}
        for g in result["groups"]
    ]
    one = {**result, "groups": no_ci}
    out = Kept(tmp_path)
    fig = comparison.plot(one, out)["metrics"]
    check_figure(fig)
    assert [t for t in _legend_entries(fig) if "no interval" in t]
    assert not [t for t in _legend_entries(fig) if "CI" in t]


@pytest.mark.parametrize("draws", [5, 2])
def test_the_fedtp_figures_of_its_kept_run(draws, tmp_path):
    """The record's own dp_sweep (5 noise draws a sigma): its interval drawn; cut to 2 draws (the
    small slice's), the draws as points and no interval (a t quantile of 12.7). The gain
    histogram of the record's 946 unchanged, 63 improved and 49 worsened conversations: a log
    axis, so the changed ones show."""
    results = _results("fedtp_paper-58/run/results.json")
    for row in results["dp_sweep"]:
        row["ehr_per_seed"], row["seeds"] = row["ehr_per_seed"][:draws], draws
    d = results["per_conversation_gain"]
    gains = np.repeat([0.0, 0.125, -0.125], [d["unchanged"], d["improved"], d["worsened"]])
    out = Kept(tmp_path)
    fedtp_report.plots(out, results, gains)
    _check_all(out.figures, {"ehr_vs_epsilon", "gain_histogram"})
    (ax,) = out.figures["ehr_vs_epsilon"].axes
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert len(bars) == (draws >= fedtp_report.MIN_DRAWS)
    assert (
        sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))
        == 5 * draws
    )
    assert out.figures["gain_histogram"].axes[0].get_yscale() == "log"


def test_the_run_report_figures_of_kept_runs(tmp_path):
    """Each experiment's own plots and the learning curve, from a kept run of each."""
    runs = {
        "fede4rag": "fede4rag_arms-39/seed-0/results.json",
        "feddtre": "feddtre_power_pilot-41c/seed-16/results.json",
        "fedbiscuit": "fedbiscuit_length-40/seed-12/results.json",
    }
    out = Kept(tmp_path)
    fede4rag_report.plot(_results(runs["fede4rag"]), out)
    feddtre_report._plot_alpha(_results(runs["feddtre"]), out)
    feddtre_report._plot_alpha_gap(_results(runs["feddtre"]), out)
    fedbiscuit = _results(runs["fedbiscuit"])
    fedbiscuit_report._plot_accuracy(fedbiscuit, out)
    fedbiscuit_report._plot_purity(fedbiscuit, out)
    fedbiscuit_report._plot_reward_hacking(fedbiscuit["rlhf"]["reward_hacking"], out)
    for name, path in runs.items():
        curve = learning_curve(_results(path), Kept(tmp_path / name), name)
        assert curve is not None and curve.axes[0].get_xlabel() == "round"
        check_figure(curve)
    _check_all(
        out.figures,
        {
            "retrieval_by_method",
            "alpha_per_round",
            "alpha_vs_gap",
            "selector_accuracy",
            "group_purity",
            "reward_hacking",
        },
    )


def test_the_bench_figures_of_the_docs(tmp_path):
    """docs/fedbiscuit_reward_hacking.png and docs/feddtre_alpha_vs_overfitting.png, as their
    benches draw them from their records."""
    out = Kept(tmp_path)
    data = fedbiscuit_hacking_curves.curves(RECORDS / "fedbiscuit_length-40")
    fedbiscuit_hacking_curves.plot(data, out, "hacking")
    runs = feddtre_alpha_pooled.completed_runs([RECORDS / "feddtre_power_pilot-41c"])
    rounds = feddtre_alpha_pooled.pooled(runs, "feddtre", "persona_chat")
    stats = feddtre_report.alpha_vs_gap(rounds, "client", seed=0)
    feddtre_alpha_pooled.plot(rounds, stats, len(runs), out, "alpha")
    _check_all(out.figures, {"hacking", "alpha"})


def test_the_kd_sweep_and_privacy_audit_figures(tmp_path):
    """The figures no kept record holds the input of: FedE4RAG's KD sweep per cell and a run's
    privacy audit (``fedsim.runtime.server_app.audit_section``), on the shapes their runs give."""
    cells = {
        f"steps{s}_kd1": {
            "local_steps": s,
            "rounds": {k: {"kd": 1.2 + k, "client-distance": 2.0 * k} for k in (1, 2, 3)},
        }
        for s in (2, 4)
    }
    bounds = [
        Bound("prior", sigma, upper, lower, 1e-5, 0.95, 256, 256, correct, "threshold")
        for sigma, upper, lower, correct in [
            (0.5, 15.5, 0.9, 180),
            (1.0, 6.57, 0.5, 160),
            (4.0, 1.36, 0.0, 130),
        ]
    ]
    out = Kept(tmp_path)
    fede4rag_report.kd_sweep_plot({"cells": cells}, out)
    audit_section(AuditReport(bounds, "the prior"), out)
    _check_all(out.figures, {"kd_by_round", "client-distance_by_round", "privacy_audit"})
