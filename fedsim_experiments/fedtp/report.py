"""FedTP's report: the tables of ``summary.md`` and the plots, from a run's results (the protocol
that produced them: ``protocol.py``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from matplotlib.ticker import FormatStrFormatter, MaxNLocator, NullFormatter

from fedsim.results.outputs import RunOutput, markdown_table, plain_log_scale
from fedsim.results.stats import GAIN_TOL, t_interval
from fedsim_experiments.fedtp.settings import ROUTERS

SCORE_COLUMNS = ["turns", "ehr", "err", "support_ratio"]
MIN_DRAWS = 3  # noise draws an interval is drawn over, at least
DOMINANT = 10  # a bar this many times the next tallest puts the histogram on a log axis


def plots(out: RunOutput, results: dict, gains: np.ndarray) -> None:
    _plot_privacy(out, results)
    _plot_gains(out, results["per_conversation_gain"], gains)


def _plot_privacy(out: RunOutput, results: dict, name: str = "ehr_vs_epsilon") -> None:
    """Test EHR against epsilon: each DP sigma's noise draws and their mean (:func:`_draws`), the
    noiseless FedMix and TF-IDF as lines. They often coincide (a small slice, a prior that
    changes no decision): the noiseless line is a wide band under the thin dashed TF-IDF line,
    so both stay visible, and the legend sits outside the data."""
    fig, ax, save = out.figure(name)
    rows = [
        r for r in results["dp_sweep"] if r["epsilon"] is not None and np.isfinite(r["epsilon"])
    ]
    for r in results["dp_sweep"]:
        if r not in rows:
            ax.axhline(
                r["ehr_mean"],
                color="tab:green",
                lw=7,
                alpha=0.35,
                zorder=1,
                label=f"FedMix, no noise (sigma = 0): {r['ehr_mean']:.3f}",
            )
    base = results["routers"]["tfidf"]["overall"]["ehr"]
    ax.axhline(
        base, color="black", ls=(0, (4, 3)), lw=1.2, zorder=2, label=f"TF-IDF only: {base:.3f}"
    )
    if rows:
        eps, means = [r["epsilon"] for r in rows], np.array([r["ehr_mean"] for r in rows])
        _draws(ax, rows, eps, means)
        for r in rows:
            ax.annotate(
                f"sigma = {r['sigma']:g}",
                (r["epsilon"], r["ehr_mean"]),
                textcoords="offset points",
                xytext=(8, -12),
                fontsize=8,
            )
        ax.set_xscale("log")
        ax.set_xticks(eps, [f"{e:.3g}" for e in eps])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(min(eps) / 1.5, max(eps) * 1.5)
    ax.margins(y=0.3)
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.3f"))
    delta = rows[0]["delta"] if rows else None
    ax.set_xlabel(
        f"privacy budget epsilon (delta = {delta:g}; smaller is more private)"
        if delta
        else "privacy budget epsilon"
    )
    ax.set_ylabel("test evidence hit rate (share of turns)")
    ax.set_title("Evidence hit rate against privacy (one-shot Gaussian prior)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, frameon=False)
    save()


def _draws(ax, rows: list[dict], eps: list[float], means: np.ndarray) -> None:
    """Each DP sigma's noise draws as points and their mean; a 95% t interval only over
    :data:`MIN_DRAWS` draws or more (over 2 the t quantile is 12.7: an interval that says
    nothing the two points do not)."""
    draws = rows[0]["seeds"]
    ax.plot(eps, means, marker="o", color="tab:blue", zorder=3, label="FedMix, DP prior: mean")
    ax.scatter(
        [e for e, r in zip(eps, rows) for _ in r["ehr_per_seed"]],
        [v for r in rows for v in r["ehr_per_seed"]],
        s=14,
        color="tab:blue",
        alpha=0.5,
        zorder=3,
        label=f"FedMix, DP prior: each of {draws} noise draws",
    )
    if draws >= MIN_DRAWS:
        half = [
            0.0 if (ci := t_interval(r["ehr_per_seed"], 0.95)) is None else (ci[1] - ci[0]) / 2
            for r in rows
        ]
        ax.errorbar(
            eps,
            means,
            yerr=half,
            fmt="none",
            capsize=4,
            color="tab:blue",
            zorder=3,
            label=f"95% CI over {draws} noise draws",
        )


def _plot_gains(out: RunOutput, d: dict, gains: np.ndarray) -> None:
    """Per-conversation gains in bins of 1/8 centred on its multiples, so 0 is a bin's centre,
    not an edge, and the common gains (1/2, 1/4, 1/8 of a conversation's turns) are centres too;
    the unchanged conversations (gain exactly 0) are their own grey part of the centre bar,
    apart from small gains. On a log axis where one bar is :data:`DOMINANT` times the next (947
    unchanged conversations hid the 113 changed ones)."""
    fig, ax, save = out.figure("gain_histogram")
    unchanged = np.abs(gains) <= GAIN_TOL
    ax.hist(
        [gains[unchanged], gains[~unchanged]],
        bins=np.linspace(-1.0625, 1.0625, 18),
        stacked=True,
        color=["tab:gray", "tab:blue"],
        edgecolor="black",
        label=[
            f"unchanged (gain 0): {d['unchanged']}",
            f"changed: {d['improved']} improved, {d['worsened']} worsened",
        ],
    )
    heights = sorted(sum(c.get_height() for c in bar) for bar in zip(*ax.containers))
    if heights[-1] > DOMINANT * max(heights[-2], 1):  # one bar would hide the rest
        plain_log_scale(ax)
        ax.set_ylabel("conversations (log scale)")
    else:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("conversations")
    ax.set_xlabel("per-conversation gain in evidence hit rate, FedMix - TF-IDF (share of turns)")
    ax.set_title(
        f"EHR gain per conversation: {d['groups']} test conversations, mean {d['mean_gain']:+.3f}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    save()


def summary(r: dict, test: list[str]) -> str:
    router_rows = [
        {"router": name, "split": split, **r["routers"][name][split]}
        for name in ROUTERS
        for split in [*test, "overall"]
    ]
    amb, ch = r["ambiguous"], r["changed_decisions"]
    lo, hi = r["bootstrap_ci_ehr_gain"]
    unit = r["bootstrap_ci_ehr_gain_unit"]
    over_global = r["bootstrap_ci_ehr_gain_over_global"]
    return (
        "\n\n".join(
            [
                f"# {r['experiment']}",
                f"Prior from {r['prior_clients']['count']} clients of {', '.join(r['prior_clients']['splits'])}"
                f" (sigma = {r['noise_multiplier']:g}); lambda = {r['lambda']:g} (tuned), alpha = {r['alpha']:g}.",
                "## Routers on test\n"
                + markdown_table(router_rows, ["router", "split", *SCORE_COLUMNS]),
                "## Lambda sweep (validation, FedMix)\n"
                + markdown_table(r["lambda_sweep"], ["lambda", *SCORE_COLUMNS]),
                "## DP sweep (test, FedMix)\n"
                + markdown_table(
                    r["dp_sweep"],
                    [
                        "sigma",
                        "epsilon",
                        "epsilon_rdp",
                        "epsilon_pld",
                        "ehr_mean",
                        "ehr_std",
                        "seeds",
                    ],
                ),
                "## Analyses\n"
                f"- EHR gain FedMix - TF-IDF: {r['ehr_gain']:.4f}, paired bootstrap 95% CI [{lo:.4f}, {hi:.4f}] "
                f"over {unit['clusters']} {unit['unit']}s\n"
                f"- ablation, FedMix - global prior alone: {r['ehr_gain_over_global']:.4f}, 95% CI "
                f"[{over_global[0]:.4f}, {over_global[1]:.4f}] over the same {unit['unit']}s\n"
                f"- routing decisions changed: {ch['count']} of {ch['turns']} ({ch['share']:.2%})\n"
                f"- ambiguous turns: {amb['turns']}"
                + (
                    ""
                    if amb["ehr_tfidf"] is None
                    else f"; EHR TF-IDF {amb['ehr_tfidf']:.4f}, FedMix {amb['ehr_fedmix']:.4f}"
                ),
                "## Per-conversation EHR gain (FedMix - TF-IDF)\n"
                + markdown_table(
                    [r["per_conversation_gain"]],
                    ["groups", "improved", "worsened", "unchanged", "mean_gain"],
                ),
            ]
        )
        + "\n"
    )


def main() -> None:
    """``ehr_vs_epsilon.png`` of a kept run's results.json (its ``dp_sweep``), e.g. the docs' figure:
    ``python -m fedsim_experiments.fedtp.report records/fedtp_paper-58/run --into docs
    --name fedtp_ehr_vs_epsilon``. The gain histogram needs the per-conversation gains, which
    results.json does not keep."""
    ap = argparse.ArgumentParser(description=main.__doc__.split("\n")[0])
    ap.add_argument("run", type=Path, help="a run folder holding results.json")
    ap.add_argument("--into", type=Path, default=Path("."))
    ap.add_argument("--name", default="ehr_vs_epsilon", help="the PNG's name, without .png")
    args = ap.parse_args()
    results = json.loads((args.run / "results.json").read_text())
    _plot_privacy(RunOutput(args.into), results, args.name)


if __name__ == "__main__":
    main()
