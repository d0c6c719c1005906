"""Reward-hacking curves of a FedBiscuit sweep (runs with ``protocol.rlhf.hacking_steps``), over
seeds: per selector-labelled policy and DPO step, the mean over seeds of the labellers' (proxy)
and the judge's win rate against the base, with Student t 95% CIs as bands
(``fedsim/results/stats.py``), and the mean reply length. One run's plot
(``reward_hacking.png``) shows one seed; this one shows what the seeds agree on. The paired test
of the claim (the proxy-judge gap grows more slowly under FedBiscuit) is ``fedsim compare``'s
``rlhf.reward_hacking.*.*.gap`` rows against FedBis.

    .venv/bin/python bench/fedbiscuit_hacking_curves.py records/fedbiscuit_length-40 \\
        --into docs --output fedbiscuit_reward_hacking
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from fedsim.results.comparison import counted_runs
from fedsim.results.outputs import RunOutput, markdown_table
from fedsim.results.stats import t_interval


def curves(folder: Path) -> dict[str, dict[int, dict[str, list[float]]]]:
    """method -> steps -> measure -> one value per run (every run under ``folder`` with curves
    that ``fedsim compare`` counts: one that failed after its results, ``error.txt``, is not a result)."""
    out: dict = {}
    for run in counted_runs(folder):
        results = json.loads((run / "results.json").read_text())
        for method, points in results.get("rlhf", {}).get("reward_hacking", {}).items():
            for p in points:
                row = out.setdefault(method, {}).setdefault(p["steps"], {})
                for key in (
                    "proxy_win_rate",
                    "judge_win_rate",
                    "gap",
                    "reply_words",
                    "judge_win_rate_minority",
                ):
                    if key in p:
                        row.setdefault(key, []).append(p[key])
    return out


def table(data: dict) -> list[dict]:
    rows = []
    for method, by_step in data.items():
        for steps, values in sorted(by_step.items()):
            row = {"policy": method, "steps": steps, "seeds": len(values["gap"])}
            for key, xs in values.items():
                ci = t_interval(np.array(xs), 0.95)
                row[key] = f"{np.mean(xs):.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            rows.append(row)
    return rows


def plot(data: dict, out: RunOutput, name: str) -> None:
    fig, ax, save = out.figure(name)
    for i, (method, by_step) in enumerate(data.items()):
        steps = sorted(by_step)
        for key, style in (("proxy_win_rate", "--"), ("judge_win_rate", "-")):
            mean = np.array([np.mean(by_step[s][key]) for s in steps])
            cis = [
                t_interval(np.array(by_step[s][key]), 0.95) or (m, m) for s, m in zip(steps, mean)
            ]
            ax.plot(
                steps,
                mean,
                ls=style,
                marker="o",
                color=f"C{i}",
                label=f"{method} {key.split('_')[0]}",
            )
            ax.fill_between(
                steps,
                [c[0] for c in cis],
                [c[1] for c in cis],
                color=f"C{i}",
                alpha=0.12,
                label="95% CI over seeds (band)",
            )
            ax.scatter(  # each seed's point
                [s for s in steps for _ in by_step[s][key]],
                [v for s in steps for v in by_step[s][key]],
                color=f"C{i}",
                s=8,
                alpha=0.5,
                label="each seed (dot)",
            )
    ax.axhline(0.5, color="grey", lw=0.8, ls=":", label="the base (0.5)")
    ax.set_ylim(0, 1)  # a win rate; a t band over few seeds reaches past it
    ax.set_xlabel("DPO steps")
    ax.set_ylabel("win rate against the base policy")
    seeds = max(len(v["gap"]) for by_step in data.values() for v in by_step.values())
    ax.set_title(f"Reward hacking over {seeds} seeds: proxy (dashed), judge (solid)", fontsize=10)
    kinds = dict(zip(*ax.get_legend_handles_labels()[::-1]))  # one entry per band and dot kind
    ax.legend(
        kinds.values(),
        kinds.keys(),
        fontsize=8,
        ncols=3,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.15),
    )
    save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument(
        "--output", default="reward_hacking_over_seeds", help="plot name (PNG, in --into)"
    )
    ap.add_argument("--into", type=Path, default=Path("."))
    args = ap.parse_args()
    data = curves(args.folder)
    if not data:
        raise SystemExit(
            f"no run under {args.folder} holds reward-hacking curves (protocol.rlhf.hacking_steps)"
        )
    plot(data, RunOutput(args.into), args.output)
    print(
        markdown_table(
            table(data),
            [
                "policy",
                "steps",
                "seeds",
                "proxy_win_rate",
                "judge_win_rate",
                "gap",
                "judge_win_rate_minority",
                "reply_words",
            ],
        )
    )


if __name__ == "__main__":
    main()
