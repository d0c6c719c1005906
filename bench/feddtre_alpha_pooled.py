"""FedDTRE's alpha against each client's overfitting, pooled over the seeds of a sweep.

Each run reports the relation over its own client-rounds (``results.json`` ``alpha_gap``, 12 at
the pilot setting, from a few clients: wide CIs); this pools every completed run's client-rounds under the
same statistic (``fedsim_experiments.feddtre.report.alpha_vs_gap``: r's CI a bootstrap over
clients, each client's rounds of every seed resampled together), prints it per method and
dataset with the per-seed r, and plots the points.

    .venv/bin/python bench/feddtre_alpha_pooled.py SWEEP_DIR [SWEEP_DIR ...] \
        --plot docs/feddtre_alpha_vs_overfitting.png --json records/feddtre_alpha_pooled/alpha_pooled.json

``--json`` keeps the pooled statistics as a record, so a page's marker can name them.
``--from-round 2`` leaves out every round before 2 (round 1 mixes with the untrained global
model); ``--mixed`` adds a linear mixed model, alpha on the gap with a random intercept per seed
and a variance component per client within its seed (statsmodels MixedLM, REML): the slope, its
95% Wald CI and p, the unit being the client within its seed, not the client-round.
``--per-round PNG`` plots each round's alpha of the leaking (``task.contamination``) and the
clean clients, mean over seeds with a t interval of the per-seed gap.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr, t

from fedsim.results.outputs import RunOutput
from fedsim_clients import feddtre_messages as keys
from fedsim_experiments.feddtre.report import alpha_vs_gap


def completed_runs(sweeps: list[Path]) -> dict[str, dict]:
    """``{run name: results}`` of every completed run of the sweep folders."""
    runs = {}
    for sweep in sweeps:
        for run in json.loads((sweep / "sweep.json").read_text())["runs"]:
            if run["status"] == "completed":
                runs[run["name"]] = json.loads((sweep / run["name"] / "results.json").read_text())
    return runs


def pooled(
    runs: dict[str, dict], method: str, dataset: str, first: int = 1
) -> dict[tuple[str, str], list[dict]]:
    """Every run's client-rounds from round ``first`` on, keyed by (run, round) so that rounds of
    two seeds stay apart."""
    return {
        (name, rnd): rows["clients"]
        for name, r in runs.items()
        for rnd, rows in r["alpha"][method][dataset].items()
        if int(rnd) >= first
    }


def mixed_model(client_rounds: dict[tuple[str, str], list[dict]]) -> dict:
    """alpha = a + b gap + seed + client-within-seed + noise (statsmodels MixedLM, REML): b, its
    95% Wald CI and p, and the groups it rests on."""
    import pandas as pd
    import statsmodels.formula.api as smf

    data = pd.DataFrame(
        [
            {
                "alpha": row[keys.ALPHA],
                "gap": row[keys.HELDOUT_NLL] - row[keys.TRAIN_NLL],
                "seed": run,
                "client": f"{run}/{row['partition']}",
            }
            for (run, _), rows in client_rounds.items()
            for row in rows
        ]
    )
    fit = smf.mixedlm(
        "alpha ~ gap", data, groups="seed", vc_formula={"client": "0 + C(client)"}
    ).fit(reml=True)
    low, high = fit.conf_int().loc["gap"]
    return {
        "slope": float(fit.params["gap"]),
        "ci": [float(low), float(high)],
        "p": float(fit.pvalues["gap"]),
        "client_rounds": len(data),
        "seeds": int(data["seed"].nunique()),
        "clients": int(data["client"].nunique()),
        "converged": bool(fit.converged),
    }


def per_round_gap(runs: dict[str, dict], method: str, dataset: str) -> dict[str, dict]:
    """Per round: the leaking and the clean clients' mean alpha in each run, and over runs the
    mean leaking-minus-clean gap with its 95% t interval (unit: the seed)."""
    out: dict[str, dict] = {}
    for r in runs.values():
        leaking = set(r["contamination"]["clients"])
        for rnd, rows in r["alpha"][method][dataset].items():
            lk = [x[keys.ALPHA] for x in rows["clients"] if x["partition"] in leaking]
            cl = [x[keys.ALPHA] for x in rows["clients"] if x["partition"] not in leaking]
            if lk and cl:
                at = out.setdefault(rnd, {"leaking": [], "clean": []})
                at["leaking"].append(float(np.mean(lk)))
                at["clean"].append(float(np.mean(cl)))
    for at in out.values():
        gap = np.subtract(at["leaking"], at["clean"])
        half = (
            t.ppf(0.975, gap.size - 1) * gap.std(ddof=1) / np.sqrt(gap.size)
            if gap.size > 1
            else float("nan")
        )
        at["gap"] = {"mean": float(gap.mean()), "ci": [gap.mean() - half, gap.mean() + half]}
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


def plot_per_round(rounds: dict[str, dict], seeds: int, out: RunOutput, name: str):
    """``<name>.png``: each round's mean alpha of the leaking and the clean clients over seeds,
    and their gap with its 95% t interval over seeds. Returns the figure."""
    fig, ax, save = out.figure(name)
    x = [int(r) for r in rounds]
    for group in ("leaking", "clean"):
        ax.plot(x, [np.mean(v[group]) for v in rounds.values()], marker="o", label=group)
    gap = [v["gap"] for v in rounds.values()]
    ax.errorbar(
        x,
        [g["mean"] for g in gap],
        yerr=[[g["mean"] - g["ci"][0] for g in gap], [g["ci"][1] - g["mean"] for g in gap]],
        marker="s",
        capsize=3,
        label="leaking minus clean (95% t over seeds)",
    )
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_xlabel("round")
    ax.set_ylabel("alpha (weight of the global model)")
    ax.set_title(f"FedDTRE alpha per round, leaking and clean clients, {seeds} seeds", fontsize=9)
    ax.legend(fontsize=8)
    save()
    return fig


def plot(client_rounds: dict, stats: dict, seeds: int, out: RunOutput, name: str):
    """``<name>.png`` in ``out``: every pooled client-round's alpha against its overfitting gap,
    Pearson's r and its cluster-bootstrap CI (over clients, ``stats``) in the title, as numbers:
    an interval of r, not of any point drawn. Returns the figure."""
    rows = [row for rs in client_rounds.values() for row in rs]
    fig, ax, save = out.figure(name)
    ax.scatter(
        [row[keys.HELDOUT_NLL] - row[keys.TRAIN_NLL] for row in rows],
        [row[keys.ALPHA] for row in rows],
        s=12,
        alpha=0.6,
        label=f"a client in a round ({len(rows)})",
    )
    ax.set_xlabel("local model: held-out minus train NLL (nats per token)")
    ax.set_ylabel("alpha (weight of the global model)")
    ax.set_title(
        f"FedDTRE alpha against overfitting, {seeds} seeds\nPearson r "
        f"{stats['pearson_r']:+.2f} [{stats['ci'][0]:+.2f}, {stats['ci'][1]:+.2f}] "
        f"(95% bootstrap over {stats['clusters']} clients)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    save()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+", type=Path)
    parser.add_argument("--method", default="feddtre")
    parser.add_argument("--dataset", default="persona_chat")
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--from-round", type=int, default=1, help="leave out earlier rounds")
    parser.add_argument("--mixed", action="store_true", help="add the mixed model (statsmodels)")
    parser.add_argument("--per-round", type=Path, help="plot alpha per round, leaking vs clean")
    parser.add_argument(
        "--json", type=Path, help="also write the pooled statistics here (a record)"
    )
    args = parser.parse_args()
    runs = completed_runs(args.sweeps)
    client_rounds = pooled(runs, args.method, args.dataset, args.from_round)
    stats = alpha_vs_gap(
        client_rounds, "client", seed=0
    )  # a client's rounds of every seed: one cluster
    rows = [row for rs in client_rounds.values() for row in rs]
    gap = [row[keys.HELDOUT_NLL] - row[keys.TRAIN_NLL] for row in rows]
    alpha = [row[keys.ALPHA] for row in rows]
    floor = min(alpha)
    summary = {
        **stats,
        "spearman": float(spearmanr(alpha, gap).statistic),
        "share_at_floor": sum(a == floor for a in alpha) / len(alpha),
        "floor": floor,
    }
    if args.from_round > 1:
        summary["from_round"] = args.from_round
    if args.mixed:
        summary["mixed_model"] = mixed_model(client_rounds)
    if args.per_round:
        summary["per_round"] = per_round_gap(runs, args.method, args.dataset)
        plot_per_round(
            summary["per_round"], len(runs), RunOutput(args.per_round.parent), args.per_round.stem
        )
    print(f"{len(runs)} runs, {stats['client_rounds']} client-rounds")
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    print(
        "per run r:",
        {
            name: round(r["alpha_gap"][args.method][args.dataset].get("pearson_r", float("nan")), 2)
            for name, r in sorted(runs.items(), key=lambda kv: int(kv[0].split("-")[-1]))
        },
    )
    if args.plot:
        out = RunOutput(args.plot.parent)
        plot(client_rounds, stats, len(runs), out, args.plot.stem)


if __name__ == "__main__":
    main()
