"""What a reader reads of a result: metrics by name and unit, small numbers that do not print as
0, counts without intervals below 0, a run's summary that leads with its headline and verdict,
and a learning curve for every run that records rounds."""

import json

import numpy as np
from omegaconf import OmegaConf

from fedsim.config.compose import CONF_DIR
from fedsim.config.data import REPO_ROOT
from fedsim.config.schema import typed_sweep
from fedsim.results import comparison
from fedsim.results.comparison import Run, compare, read_config, run_headline
from fedsim.results.curves import learning_curve, per_round
from fedsim.results.display import axis_label, label
from fedsim.results.outputs import RunOutput, markdown_table, number_text


def _settings(**changes):
    return typed_sweep(OmegaConf.load(CONF_DIR / "config.yaml").sweep, OmegaConf.create(changes))


def test_a_results_path_reads_as_its_measure_unit_and_what_tells_it_apart():
    assert label("routers.fedmix.overall.ehr") == "fedmix, overall: evidence hit rate"
    assert axis_label("routers.*.*.ehr") == "evidence hit rate (share of turns)"
    assert label("unknown_table.a.my_metric") == "unknown_table, a: my metric"  # as written


def test_a_small_number_keeps_its_digits():
    """delta 1e-5 printed as 0.0000; a number under the last decimal's unit keeps its digits."""
    assert [number_text(v) for v in (1e-5, -3.2e-6, 0.0, 0.12345)] == [
        "1e-05",
        "-3.2e-06",
        "0.0000",
        "0.1235",
    ]
    assert number_text(2e-5, sign=True) == "+2e-05"
    assert "| 1e-05 |" in markdown_table([{"delta": 1e-5}], ["delta"])


def test_a_counts_interval_stops_at_0_and_says_so():
    """Reply lengths of 0, 0, 9 words: the t interval over seeds reaches below 0; the summary
    clips it at 0 and marks it (the comparison's own numbers are unchanged)."""
    runs = [
        Run(f"r{s}", {"seed": str(s)}, {"m.a.reply_words": w, "m.a.win_rate": 0.5 + w / 100})
        for s, w in enumerate([0.0, 0.0, 9.0])
    ]
    out = compare(runs, _settings())
    (group,) = out["groups"]
    assert group["metrics"]["m.a.reply_words"]["ci"][0] < 0
    text = comparison.summary_markdown(out)
    row = next(line for line in text.splitlines() if "| m.a.reply_words |" in line)
    assert "[0.0000, " in row and "(clipped at 0)" in row
    win = next(line for line in text.splitlines() if "| m.a.win_rate |" in line)
    assert "clipped" not in win


def test_a_runs_summary_leads_with_its_headline_and_its_own_verdict():
    """The kept FedTP run: its headline metrics by name, and FedMix minus TF-IDF judged by the
    run's bootstrap over conversations (the verdict its page states: excluded)."""
    run = REPO_ROOT / "records" / "fedtp_paper-58" / "run"
    results = json.loads((run / "results.json").read_text())
    settings = typed_sweep(
        OmegaConf.load(CONF_DIR / "config.yaml").sweep, read_config(run / "config.yaml").sweep
    )
    lead = run_headline(results, settings)
    assert lead.startswith("## Headline") and "| fedmix, overall: evidence hit rate |" in lead
    verdicts = lead.split("### Verdicts (this run alone)")[1]
    assert "| fedmix, overall: evidence hit rate - tfidf | 0.0031 |" in verdicts
    assert "excluded" in verdicts and "other differences: no claim from one run" in verdicts
    summary = comparison.lead_with("**Warning: x.**\n\n# fedtp\n\nbody\n", lead)
    assert summary.index("# fedtp") < summary.index("## Headline") < summary.index("body")


def test_a_round_based_run_gets_a_learning_curve_and_another_none(tmp_path):
    results = {
        "curve": [{"round": r, "accuracy": 0.4 + r / 10, "loss": 2.0 - r / 10} for r in range(4)],
        "methods": {
            m: {"rounds": {str(r): {"infonce": 1.0 / r, "step-seconds": 3.0} for r in (1, 2)}}
            for m in ("a", "b")
        },
    }
    curves = per_round(results)
    assert list(curves) == ["accuracy", "loss", "infonce"]  # seconds are no learning curve
    assert curves["infonce"] == {"a": {1: 1.0, 2: 0.5}, "b": {1: 1.0, 2: 0.5}}
    fig = learning_curve(results, RunOutput(tmp_path), "toy")
    assert (tmp_path / "learning_curve.png").is_file() and len(fig.axes) == 3
    assert [ax.get_xlabel() for ax in fig.axes] == ["round"] * 3
    np.testing.assert_allclose(fig.axes[0].lines[0].get_ydata(), [0.4, 0.5, 0.6, 0.7])
    assert learning_curve({"accuracy": 0.5}, RunOutput(tmp_path / "none"), "toy") is None
    assert not (tmp_path / "none" / "learning_curve.png").exists()
