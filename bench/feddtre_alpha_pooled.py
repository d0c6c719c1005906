"""FedDTRE's alpha against each client's overfitting, pooled over the seeds of a sweep.

Each run reports the relation over its own client-rounds (``results.json`` ``alpha_gap``, 12 at
the pilot setting, from a few clients: wide CIs); this pools every completed run's client-rounds under the
same statistic (``fedsim_experiments.feddtre.report.alpha_vs_gap``: r's CI a bootstrap over
clients, each client's rounds of every seed resampled together), prints it per method and
dataset with the per-seed r, and plots the points.

    .venv/bin/python bench/feddtre_alpha_pooled.py SWEEP_DIR [SWEEP_DIR ...] \
        --plot docs/feddtre_alpha_vs_overfitting.png --json records/feddtre_alpha_pooled/alpha_pooled.json

``--json`` keeps the pooled statistics as a record, so a page's marker can name them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from scipy.stats import spearmanr

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


def pooled(runs: dict[str, dict], method: str, dataset: str) -> dict[tuple[str, str], list[dict]]:
    """Every run's client-rounds, keyed by (run, round) so that rounds of two seeds stay apart."""
    return {
        (name, rnd): rows["clients"]
        for name, r in runs.items()
        for rnd, rows in r["alpha"][method][dataset].items()
    }


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
    parser.add_argument(
        "--json", type=Path, help="also write the pooled statistics here (a record)"
    )
    args = parser.parse_args()
    runs = completed_runs(args.sweeps)
    client_rounds = pooled(runs, args.method, args.dataset)
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
