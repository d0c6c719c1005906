"""What a reader keeps of a run: each plot's axes labelled, its ticks readable, a point or bar per
value with its CI, every line visible; summary.md in rounded numbers and tables. The figures are
read as matplotlib objects before they are saved (not as pixels)."""

import re

import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer
from omegaconf import OmegaConf

from fedsim.config.compose import CONF_DIR
from fedsim.config.schema import typed_sweep
from fedsim.results import comparison, provenance
from fedsim.results.comparison import Run, compare
from fedsim.results.outputs import RunOutput
from fedsim.results.sinks import Sinks
from fedsim.run import cli
from fedsim.runtime.server_app import faults_section
from fedsim_experiments.fede4rag import report as fede4rag_report
from fedsim_experiments.fedtp import report as fedtp_report
from fedsim_experiments.fedtp.settings import ROUTERS

# a float printed with more than 6 decimals, or a Python dict / list of dicts printed raw
RAW = re.compile(r"\d\.\d{7,}|\{'|\[\{|': ")


class Kept(RunOutput):
    """A RunOutput that keeps every figure it saves, by file name."""

    def __init__(self, path):
        super().__init__(path)
        self.figures = {}

    def _saving(self, fig, name):
        self.figures[name] = fig
        return super()._saving(fig, name)


def _fedtp_results() -> dict:
    """A FedTP results dict as fedtp.run builds it: 17-digit floats, a noiseless row, two DP
    sigmas over three noise draws, routers that tie (the lines that hid each other)."""
    ehr = 0.6987951807228916
    scores = {
        "turns": 83,
        "ehr": ehr,
        "err": 0.04870714842297633,
        "support_ratio": 0.2518237880872053,
    }
    return {
        "experiment": "fedtp",
        "lambda": 0.005,
        "alpha": 0.7,
        "noise_multiplier": 1.0,
        "prior_clients": {"splits": ["valid_freq"], "count": 10, "nodes": 2},
        "routers": {r: {"test_freq": scores, "overall": scores} for r in ROUTERS},
        "lambda_sweep": [{"lambda": 0.0, **scores}, {"lambda": 0.005, **scores}],
        "dp_sweep": [
            {
                "sigma": 0.0,
                "epsilon": None,
                "epsilon_rdp": None,
                "epsilon_pld": None,
                "delta": 1e-5,
                "ehr_mean": ehr,
                "ehr_std": 0.0,
                "seeds": 3,
                "ehr_per_seed": [ehr] * 3,
            },
            {
                "sigma": 1.0,
                "epsilon": 6.572989417261542,
                "epsilon_rdp": 7.077391578166642,
                "epsilon_pld": 6.572989417261542,
                "delta": 1e-5,
                "ehr_mean": 0.69,
                "ehr_std": 0.01,
                "seeds": 3,
                "ehr_per_seed": [0.68, 0.69, 0.70],
            },
            {
                "sigma": 4.0,
                "epsilon": 1.3564701289375691,
                "epsilon_rdp": 1.4781219679521882,
                "epsilon_pld": 1.3564701289375691,
                "delta": 1e-5,
                "ehr_mean": 0.65,
                "ehr_std": 0.02,
                "seeds": 3,
                "ehr_per_seed": [0.63, 0.65, 0.67],
            },
        ],
        "bootstrap_ci_ehr_gain": [-0.012048192771084338, 0.024096385542168676],
        "bootstrap_ci_ehr_gain_unit": {"unit": "conversation", "clusters": 6},
        "ehr_gain": 0.006024096385542169,
        "bootstrap_ci_ehr_gain_over_global": [-0.024096385542168676, 0.012048192771084338],
        "ehr_gain_over_global": -0.006024096385542169,
        "changed_decisions": {"count": 3, "turns": 83, "share": 0.03614457831325301},
        "ambiguous": {
            "turns": 11,
            "ehr_tfidf": 0.6363636363636364,
            "ehr_fedmix": 0.7272727272727273,
        },
        "per_conversation_gain": {
            "groups": 6,
            "improved": 2,
            "worsened": 1,
            "unchanged": 3,
            "mean_gain": 0.008333333333333333,
        },
    }


GAINS = np.array([0.0, 0.0, 0.0, 0.03, 0.5, -0.25])  # three unchanged, a small gain, two large


@pytest.fixture
def fedtp_figures(tmp_path):
    out = Kept(tmp_path)
    fedtp_report.plots(out, _fedtp_results(), GAINS)
    for fig in out.figures.values():
        fig.canvas.draw()  # tick labels are set at drawing
    assert {p.name for p in tmp_path.glob("*.png")} == {"ehr_vs_epsilon.png", "gain_histogram.png"}
    return out.figures


def test_ehr_vs_epsilon_has_units_readable_ticks_cis_and_every_line(fedtp_figures):
    (ax,) = fedtp_figures["ehr_vs_epsilon"].axes
    assert "epsilon" in ax.get_xlabel() and "delta = 1e-05" in ax.get_xlabel()
    assert "share of turns" in ax.get_ylabel()
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert (
        bars.has_yerr and len(bars.lines[2][0].get_segments()) == 2
    )  # the two DP sigmas, each with its CI over its 3 draws
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks == ["6.57", "1.36"] and not any(
        t.get_text() for t in ax.get_xticklabels(minor=True)
    )
    assert all(
        re.fullmatch(r"0\.\d{3}", t.get_text()) for t in ax.get_yticklabels() if t.get_text()
    )
    # the noiseless line and TF-IDF's tie here: a wide band under a thin dashed line, both seen
    noiseless, tfidf = [
        line
        for line in ax.get_lines()
        if len(line.get_xdata()) == 2 and line.get_label().startswith(("FedMix, no", "TF-IDF"))
    ]
    assert noiseless.get_ydata()[0] == tfidf.get_ydata()[0]
    assert (
        noiseless.get_linewidth() > 3 * tfidf.get_linewidth()
        and tfidf.get_zorder() > noiseless.get_zorder()
    )
    assert len(ax.get_legend().get_texts()) == 5  # the two lines, the mean, the draws, the CI


def test_gain_histogram_keeps_unchanged_apart_from_small_gains(fedtp_figures):
    (ax,) = fedtp_figures["gain_histogram"].axes
    assert "FedMix - TF-IDF" in ax.get_xlabel() and ax.get_ylabel() == "conversations"
    unchanged, changed = ax.containers  # the two stacked series, one bar per bin each
    assert len(unchanged) == len(changed) == 17
    edges = [p.get_x() for p in unchanged] + [unchanged[-1].get_x() + unchanged[-1].get_width()]
    assert not np.isclose(edges, 0.0).any()  # 0 is inside a bin, not on its edge
    centre = next(i for i, p in enumerate(unchanged) if p.get_x() < 0 < p.get_x() + p.get_width())
    assert (
        unchanged[centre].get_height() == 3 and changed[centre].get_height() == 1
    )  # the 0.03 gain
    assert (
        sum(p.get_height() for p in changed) == 3
        and unchanged[centre].get_facecolor() != changed[centre].get_facecolor()
    )
    assert all(t.get_text().lstrip("−-").isdigit() for t in ax.get_yticklabels() if t.get_text())


def test_the_summary_is_rounded_numbers_and_tables():
    results = _fedtp_results()
    faults = {
        "discover": {1: {"sent": 20, "failed": 0, "malformed": 1, "timed_out": 0, "accepted": 19}},
        "prior/train": {
            1: {"sent": 10, "failed": 2, "malformed": 0, "timed_out": 0, "accepted": 8}
        },
    }
    text = fedtp_report.summary(results, ["test_freq"]) + faults_section(faults)
    assert not RAW.search(text), RAW.search(text)
    assert "| 6 | 2 | 1 | 3 | 0.0083 |" in text  # the per-conversation gain, a table row
    assert (
        "| discover | 1 | 20 | 0 | 1 | 0 | 19 |" in text
        and "| prior/train | 1 | 10 | 2 | 0 | 0 | 8 |" in text
    )
    assert "EHR TF-IDF 0.6364, FedMix 0.7273" in text
    assert "95% CI [-0.0120, 0.0241] over 6 conversations" in text  # the interval's unit, named
    assert (
        "FedMix - global prior alone: -0.0060, 95% CI [-0.0241, 0.0120] over the same conversations"
        in text
    )


def test_the_sweep_plots_have_a_labelled_point_and_interval_per_row(tmp_path):
    runs = [
        Run(
            f"r{s}",
            {"seed": str(s)},
            {"m.new.acc": 0.5 + d, "m.old.acc": 0.5 + d / 2, "m.other.acc": 0.4 + d},
        )
        for s, d in enumerate([0.01, 0.03, 0.02, 0.04])
    ]
    sweep = OmegaConf.load(CONF_DIR / "config.yaml").sweep
    sweep.baseline = "old"
    result = compare(runs, typed_sweep(sweep))
    out = Kept(tmp_path)
    comparison.plot(result, out)
    for name, rows in (("paired_differences", 2), ("metrics", 3)):
        (ax,) = out.figures[name].axes
        assert ax.get_xlabel() and ax.get_title() and out.figures[name]._suptitle.get_text()
        (legend,) = out.figures[name].legends
        assert "mean, 95% CI over seeds" in [t.get_text() for t in legend.get_texts()]
        assert len([t for t in ax.get_yticklabels() if t.get_text()]) == rows
        assert (
            len([c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.has_xerr])
            == rows
        )


def test_a_log_axis_reads_in_plain_numbers(tmp_path):
    """The KD sweep's log axes: a point per round of each cell, labels like "2", never "2x10^0"."""
    cells = {
        f"steps{s}_kd1": {
            "local_steps": s,
            "rounds": {k: {"kd": 1.2 + k, "client-distance": 2.0 * k} for k in (1, 2, 3)},
        }
        for s in (2, 4)
    }
    out = Kept(tmp_path)
    fede4rag_report.kd_sweep_plot({"cells": cells}, out)
    for name in ("kd_by_round", "client-distance_by_round"):
        (ax,) = out.figures[name].axes
        out.figures[name].canvas.draw()
        assert (
            ax.get_xlabel() == "optimizer steps per client"
            and ax.get_ylabel()
            and ax.get_yscale() == "log"
        )
        assert [len(line.get_xdata()) for line in ax.get_lines()] == [3, 3]
        labels = [
            t.get_text()
            for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)
            if t.get_text()
        ]
        assert labels and not any("times" in t or "^" in t for t in labels), labels


def test_a_runs_outputs_replace_a_link_at_their_names_and_never_write_through_it(
    tmp_path, victim_home
):
    """Every file fedsim writes into a results folder is a new file renamed over its name: a link
    planted there (in a record, or at the name of a temporary file) is replaced or left alone,
    and what it pointed to, here ``~/.bashrc``, is not written."""
    out = RunOutput(tmp_path / "run")
    names = [
        "config.yaml",
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        ".hydra/hydra.yaml",
        "results.json",
        "summary.md",
        "error.txt",
        "plot.png",
        "metrics.csv",
    ]
    (out.path / ".hydra").mkdir()
    for name in [*names, ".results.json.tmp"]:
        (out.path / name).symlink_to(victim_home / ".bashrc")
    out.write_config(OmegaConf.create({"a": 1}), ["a=1"], OmegaConf.create({}))
    out.write_results({"acc": 0.5}, "# summary\n")
    provenance.stamp(out.path, {"command": {"line": "fedsim run"}})
    out.write_error("failed")
    out.figure("plot")[2]()
    Sinks(out.path, to_csv=True).close()
    assert (victim_home / ".bashrc").read_text() == "# the user's own\n"
    assert [n for n in names if (out.path / n).is_symlink() or not (out.path / n).is_file()] == []


def test_a_runs_checkpoint_record_never_writes_through_a_link(tmp_path, victim_home):
    """The attack: ``fedsim run ... results_dir=<a point of a shared record>`` (one point run
    again) wrote its ``checkpoint/run.json`` through a link planted there: ``~/.bashrc`` became
    the sealed overrides. It is written as every output is, a new file renamed over the name."""
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True, mode=0o700)
    (run / "checkpoint" / "run.json").symlink_to(victim_home / ".bashrc")
    cfg, overrides, _, _ = cli.prepare(["seed=0", f"results_dir={run}", "checkpoint.enabled=true"])
    cli._save_run(cfg, overrides)
    assert (victim_home / ".bashrc").read_text() == "# the user's own\n"
    assert (run / "checkpoint" / "run.json").is_file() and not (
        run / "checkpoint" / "run.json"
    ).is_symlink()


def test_a_runs_hydra_record_is_never_written_through_a_link_at_its_folder(tmp_path, victim_home):
    """The attack: a ``.hydra`` link planted in a results folder (a point of a shared record run
    again) had Hydra's record written into the folder it named: an application's own
    ``config.yaml`` there (``~/.config/app``) was replaced by the run's."""
    app = victim_home / ".config" / "app"
    app.mkdir(parents=True)
    (app / "config.yaml").write_text("theirs: 1\n")
    out = RunOutput(tmp_path / "run")
    (out.path / ".hydra").symlink_to(app, target_is_directory=True)
    out.write_config(OmegaConf.create({"a": 1}), ["a=1"], OmegaConf.create({}))
    assert [p.name for p in app.iterdir()] == ["config.yaml"] and (
        app / "config.yaml"
    ).read_text() == "theirs: 1\n"
    assert (
        not (out.path / ".hydra").is_symlink() and (out.path / ".hydra" / "config.yaml").is_file()
    )


def test_the_sweep_plots_cut_a_records_long_names(tmp_path):
    """The attack: a record's metric name of 100,000 characters (a results.json under the size
    cap holds one of millions) took matplotlib 51 s to lay out and draw as a label, time growing
    with the name. A plot's labels are cut (the summary keeps the whole name)."""
    name = "a" * 20_000
    runs = [
        Run(f"r{s}", {"seed": str(s)}, {f"m.new.{name}": 0.5 + d, f"m.old.{name}": 0.5 + d / 2})
        for s, d in enumerate([0.01, 0.03, 0.02])
    ]
    sweep = OmegaConf.load(CONF_DIR / "config.yaml").sweep
    sweep.baseline = "old"
    out = Kept(tmp_path)
    comparison.plot(compare(runs, typed_sweep(sweep)), out)
    labels = [
        t
        for fig in out.figures.values()
        for ax in fig.axes
        for t in [ax.get_xlabel(), *(t.get_text() for t in ax.get_yticklabels())]
    ]
    titles = [fig.axes[0].get_title() for fig in out.figures.values()]  # the name: the measure
    assert labels and max(map(len, labels + titles)) <= comparison.PLOT_CHARS
    assert titles and all(t.endswith("…") for t in titles)
