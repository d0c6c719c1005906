"""FedDTRE's report: the numbers a run derives from its clients' replies (alpha per round, alpha
against overfitting, contaminated against clean clients, traffic) and the summary's tables and plots."""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import pearsonr

from fedsim.results.outputs import RunOutput, markdown_table
from fedsim.results.stats import cluster_pearson_ci
from fedsim.runtime.messaging import Messenger
from fedsim_clients import feddtre_messages as keys
from fedsim_experiments.common import base_line
from fedsim_tasks.dialogue.metrics import REPLY_METRICS

METRICS = REPLY_METRICS


def spread(values: list[float]) -> dict:
    """Mean, standard deviation (ddof 1; 0 for one value), min and max."""
    return {
        "mean": float(np.mean(values)),
        "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
        "min": float(np.min(values)),
        "max": float(np.max(values)),
    }


def alpha_rows(alphas: dict[int, list[dict]]) -> dict:
    """Per round: every client's alpha (and trust scores), their mean, std, min and max."""
    return {
        str(rnd): {**spread([r[keys.ALPHA] for r in rows]), "clients": rows}
        for rnd, rows in sorted(alphas.items())
    }


ALPHA_GAP_RESAMPLES = 2000  # cluster bootstrap resamples of r's CI: a few clients, so cheap


def alpha_vs_gap(alphas: dict[int, list[dict]], unit: str, seed: int) -> dict:
    """Does a client's alpha follow its overfitting? Over every client-round: the correlation of
    alpha with the local model's held-out minus train nll (Pearson's r, scipy.stats.pearsonr; its
    95% CI a bootstrap over clients, ``unit`` (the task's: ``client``), since rounds of one client
    are not independent: Fisher's z over client-rounds would be too narrow), and whether s_g - s_l stood
    above its own noise (its mean, the mean standard error over the scoring contexts, the share of
    client-rounds beyond 2 standard errors). Empty where the clients measured no gap; no r where
    alpha or the gap does not vary, no CI under two clients or where a resample of them has no
    spread (a client whose alpha never moved, drawn alone)."""
    rows = [r for rs in alphas.values() for r in rs]
    out: dict[str, Any] = {"client_rounds": len(rows)}
    if rows and all(keys.S_GAP_SE in r for r in rows):
        gaps = np.array([r[keys.S_GLOBAL] - r[keys.S_LOCAL] for r in rows])
        se = np.array([r[keys.S_GAP_SE] for r in rows])
        out |= {
            "s_gap_mean": float(gaps.mean()),
            "s_gap_se_mean": float(se.mean()),
            "share_beyond_2se": float(np.mean(np.abs(gaps) > 2 * se)),
        }
    if not rows or not all(keys.TRAIN_NLL in r for r in rows):
        return out
    alpha = np.array([r[keys.ALPHA] for r in rows])
    gap = np.array([r[keys.HELDOUT_NLL] - r[keys.TRAIN_NLL] for r in rows])
    out |= {"loss_gap_mean": float(gap.mean()), "alpha_mean": float(alpha.mean())}
    if len(rows) >= 3 and np.ptp(alpha) > 0 and np.ptp(gap) > 0:
        out["pearson_r"] = float(pearsonr(alpha, gap).statistic)
        clients = np.array([r["partition"] for r in rows])
        out |= {"unit": unit, "clusters": int(np.unique(clients).size)}
        if (
            out["clusters"] >= 2
            and np.isfinite(
                ci := cluster_pearson_ci(alpha, gap, clients, ALPHA_GAP_RESAMPLES, seed)
            ).all()
        ):
            out["ci"] = list(ci)
    return out


def late_alpha_gap(alphas: dict[int, list[dict]], contaminated: frozenset[int], first: int) -> dict:
    """The pre-registered endpoint of ``feddtre_leak``: the contaminated clients' alpha minus the
    clean ones', over rounds ``>= first`` (round 1 mixes every local model with the untrained
    global one). The unit is the client: each client's mean alpha over those rounds, then the
    mean over the group's clients (a client sampled more often weighs no more). Empty where a
    group has no client-round from ``first`` on."""
    per_client: dict[int, list[float]] = {}
    for rnd, rows in alphas.items():
        if int(rnd) >= first:
            for r in rows:
                per_client.setdefault(int(r["partition"]), []).append(r[keys.ALPHA])
    means = {p: float(np.mean(a)) for p, a in per_client.items()}
    leaking = [a for p, a in means.items() if p in contaminated]
    clean = [a for p, a in means.items() if p not in contaminated]
    if not leaking or not clean:
        return {}
    return {
        "from_round": first,
        "contaminated": float(np.mean(leaking)),
        "clean": float(np.mean(clean)),
        "gap": float(np.mean(leaking) - np.mean(clean)),
        "clients": {str(p): a for p, a in sorted(means.items())},
    }


def contamination_rows(trained: dict, contaminated: frozenset[int], first: int = 2) -> dict:
    """The contaminated clients beside the clean ones: mean alpha, s_l and s_g over their
    client-rounds (mixing methods), and their personalized models' mean trust score and PII
    rate (every method); under a mixing, ``alpha_late`` (:func:`late_alpha_gap` from round
    ``first``)."""
    rounds = [row for rows in trained.get("alphas", {}).values() for row in rows]
    clients = trained["personalized"]["clients"]
    out = {}
    for group, members in (
        ("contaminated", lambda p: p in contaminated),
        ("clean", lambda p: p not in contaminated),
    ):
        mine = [r for r in rounds if members(r["partition"])]
        personal = [c for c in clients if members(c["partition"])]
        out[group] = {
            "client_rounds": len(mine),
            "clients": len(personal),
            **{
                k.replace("-", "_"): float(np.mean([r[k] for r in mine]))
                for k in (keys.ALPHA, keys.S_LOCAL, keys.S_GLOBAL)
                if mine and all(k in r for r in mine)
            },
            **{
                f"personal_{k}": float(np.mean([c[k] for c in personal]))
                for k in ("trust_bertscore", "pii_rate")
                if personal
            },
        }
    if late := late_alpha_gap(trained.get("alphas", {}), contaminated, first):
        out["alpha_late"] = late
    return out


def communication(messenger: Messenger, phase: str) -> dict:
    rows = list(messenger.traffic.get(f"{phase}/train", {}).values())
    if not rows:
        return {"bytes_per_round": 0.0, "rounds": 0}
    return {
        "bytes_per_round": float(np.mean([r["bytes_down"] + r["bytes_up"] for r in rows])),
        "bytes_down_per_round": float(np.mean([r["bytes_down"] for r in rows])),
        "bytes_up_per_round": float(np.mean([r["bytes_up"] for r in rows])),
        "rounds": len(rows),
    }


def summary(r: dict, out: RunOutput) -> str:
    ev = r["evaluator"]
    text = (
        f"# FedDTRE on {', '.join(r['data'])}\n\n"
        f"Trust evaluator AUC on held-out trust pairs: {ev['auc_before']:.3f} before, "
        f"{ev['auc_after']:.3f} after federated fine-tuning.\n"
        + base_line(r["base"]["sft"]).replace("Base:", "Base generator:", 1)
        + "\n"
    )
    for dataset in r["data"]:
        rows = [
            {
                "method": m,
                "strategy": v[dataset].get("strategy", ""),
                **{k: v[dataset][k] for k in METRICS},
                "MB/round": r["communication"][m][dataset]["bytes_per_round"] / 1e6,
            }
            for m, v in r["methods"].items()
        ]
        text += (
            f"\n## {dataset} ({r['data'][dataset]['evaluation']})\n"
            + markdown_table(rows, ["method", "strategy", *METRICS, "MB/round"], digits=3)
            + "\n"
            + _personalized_table(r, dataset)
            + _alpha_gap_table(r, dataset)
            + _contamination_table(r, dataset)
        )
    _plot_alpha(r, out)
    _plot_alpha_gap(r, out)
    return text


def _personalized_table(r: dict, dataset: str) -> str:
    """Each federated method's personalized models on the clients' own held-out contexts (mean
    ± std over clients), the paired trust gain over the global model, the distance to it."""
    rows = []
    for m, v in r["methods"].items():
        p = v[dataset].get("personalized")
        if p:
            rows.append(
                {
                    "method": m,
                    "clients": len(p["clients"]),
                    "own W_local": sum(c["kept_local"] for c in p["clients"]),
                    **{
                        k: f"{p[k]['mean']:.3f} ± {p[k]['std']:.3f}"
                        for k in (*METRICS, "gain_trust_bertscore", "distance_to_global")
                    },
                }
            )
    if not rows:
        return ""
    return (
        f"\n### {dataset}: personalized models on each client's own held-out contexts (mean ± std over "
        f"clients; gain: personalized minus global on the same contexts)\n"
        + markdown_table(
            rows,
            [
                "method",
                "clients",
                "own W_local",
                *METRICS,
                "gain_trust_bertscore",
                "distance_to_global",
            ],
        )
        + "\n"
    )


def _alpha_gap_table(r: dict, dataset: str) -> str:
    """Each mixing method's s_g - s_l against its noise and alpha against the overfitting gap."""
    columns = [
        "client_rounds",
        "s_gap_mean",
        "s_gap_se_mean",
        "share_beyond_2se",
        "alpha_mean",
        "loss_gap_mean",
        "pearson_r",
        "ci",
        "clusters",
    ]
    rows = [
        {"method": m, **{k: v[dataset][k] for k in columns if k in v[dataset]}}
        for m, v in r.get("alpha_gap", {}).items()
        if dataset in v
    ]
    if not rows:
        return ""
    for row in rows:
        row["ci"] = "[{:.3f}, {:.3f}]".format(*row["ci"]) if "ci" in row else ""
    return (
        f"\n### {dataset}: alpha against the local model's overfitting (held-out minus train nll per token), "
        f"over client-rounds (r's CI a bootstrap over clients); s_g - s_l against its standard error over "
        f"the scoring contexts\n" + markdown_table(rows, ["method", *columns], digits=3) + "\n"
    )


def _contamination_table(r: dict, dataset: str) -> str:
    """The contaminated clients beside the clean ones, per method (``task.contamination``)."""
    c = r.get("contamination")
    if not c:
        return ""
    columns = ["alpha", "s_local", "s_global", "personal_trust_bertscore", "personal_pii_rate"]
    rows = [
        {
            "method": m,
            **{
                f"{k} ({g})": v[dataset][g][k]
                for k in columns
                for g in ("contaminated", "clean")
                if k in v[dataset][g]
            },
        }
        for m, v in c["methods"].items()
        if dataset in v
    ]
    return (
        f"\n### {dataset}: contaminated clients {c['clients']} (share {c['share']} of their training replies "
        f"with planted PII) against the clean ones\n"
        + markdown_table(
            rows,
            ["method", *(f"{k} ({g})" for k in columns for g in ("contaminated", "clean"))],
            digits=3,
        )
        + "\n"
    )


def _plot_alpha(r: dict, out: RunOutput) -> None:
    fig, ax, save = out.figure("alpha_per_round")
    for name, by_dataset in r["alpha"].items():
        for dataset, rounds in by_dataset.items():
            x = [int(k) for k in rounds]
            mean = [v["mean"] for v in rounds.values()]
            (line,) = ax.plot(x, mean, marker="o", label=f"{name} / {dataset}")
            ax.fill_between(
                x,
                [v["min"] for v in rounds.values()],
                [v["max"] for v in rounds.values()],
                color=line.get_color(),
                alpha=0.2,
            )
    ax.set_xlabel("round")
    ax.set_ylabel("alpha (mean, min-max over clients)")
    ax.set_title("FedDTRE: weight of the global model in each client's mix")
    ax.legend(fontsize=8)
    save()


def _plot_alpha_gap(r: dict, out: RunOutput) -> None:
    """Every client-round's alpha against its local model's overfitting gap, per mixing method."""
    points = {
        (m, d): [
            (row[keys.HELDOUT_NLL] - row[keys.TRAIN_NLL], row[keys.ALPHA])
            for rnd in rounds.values()
            for row in rnd["clients"]
            if keys.TRAIN_NLL in row
        ]
        for m, by_dataset in r["alpha"].items()
        for d, rounds in by_dataset.items()
    }
    if not any(points.values()):
        return
    fig, ax, save = out.figure("alpha_vs_gap")
    for (m, d), xy in points.items():
        if xy:
            stats = r["alpha_gap"][m][d]
            label = f"{m} / {d}" + (
                f" (r {stats['pearson_r']:+.2f})" if "pearson_r" in stats else ""
            )
            ax.scatter(*zip(*xy), s=12, alpha=0.7, label=label)
    ax.set_xlabel("local model: held-out minus train nll per token")
    ax.set_ylabel("alpha")
    ax.set_title("FedDTRE: alpha against each client's overfitting, per client-round")
    ax.legend(fontsize=8)
    save()
