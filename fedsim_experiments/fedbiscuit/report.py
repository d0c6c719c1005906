"""FedBis / FedBiscuit's report: the tables of ``summary.md`` and the plots, from a run's results
(the protocol that produced them: ``protocol.py``, its policy phase ``rlhf.py``)."""

from __future__ import annotations

import numpy as np

from fedsim.results.outputs import RunOutput, markdown_table
from fedsim_experiments.common import base_line

MINORITY_DERIVED = (
    "accuracy_minority is 1 - accuracy_majority by construction (an antisymmetric scorer, both "
    "orders of every test pair, the minority's label the reverse): derived, not measured.\n\n"
)


def summary(r: dict, out: RunOutput) -> str:
    rows = []
    for name, s in r["selectors"].items():
        rows.append(
            {
                "method": name,
                **{k: v for k, v in s.items() if k != "each"},
                "MB/round": r["communication"][name]["bytes_per_round"] / 1e6,
                "regroup MB": r["communication"][name]["regroup_bytes"] / 1e6,
            }
        )
        rows += [{"method": f"{name} selector {u}", **e} for u, e in enumerate(s.get("each", []))]
    table = markdown_table(
        rows,
        ["method", "accuracy_majority", "accuracy_minority", "accuracy", "MB/round", "regroup MB"],
    )
    groups = [
        {
            "method": m,
            "round": g["round"],
            "sizes": g["sizes"],
            "minority share": [None if x is None else round(x, 2) for x in g["minority_share"]],
            "reported": g["reported"],
            "kept": g["kept"],
            "joined": g["joined"],
        }
        for m, gs in r["groups"].items()
        for g in gs
    ]
    warmup = [
        {"method": f"{m} warm-up selector {u}", **w}
        for m, ws in r["warmup"].items()
        for u, w in enumerate(ws)
    ]
    _plot_accuracy(r, out)
    _plot_purity(r, out)
    if r.get("rlhf", {}).get("reward_hacking"):
        _plot_reward_hacking(r["rlhf"]["reward_hacking"], out)
    m = r["minority_share"]
    text = (
        "# FedBis / FedBiscuit on HH-RLHF harmless-base\n\n"
        f"Minority: {m['clients']:.0%} of the clients, {m['training_pairs']:.0%} of the training pairs; "
        f"p_m: {r['client_weights']}.\n\n## Selector accuracy on held-out test pairs\n"
        + (MINORITY_DERIVED if r["minority_preference"]["kind"] == "reversed" else "")
        + table
        + "\n\n## Warm-up selectors (before the first grouping)\n"
        + markdown_table(warmup, ["method", "accuracy_majority", "accuracy_minority"])
        + "\n\n## Groups after each regroup (oracle: the fixed groups)\n"
        + markdown_table(
            groups, ["method", "round", "sizes", "minority share", "reported", "kept", "joined"]
        )
        + "\n"
    )
    return text + (_policy_summary(r) if "policy" in r else "")


def _or_blank(value):
    return "" if value is None else value


def _policy_summary(r: dict) -> str:
    def ci(v, key):
        return "" if v.get(key) is None else f"[{v[key][0]:.3f}, {v[key][1]:.3f}]"

    rows = [
        {
            "policy": m,
            "n": n,
            "win rate vs base": v["win_rate"],
            "95% CI": ci(v, "ci"),
            "minority win rate": v.get("win_rate_minority", ""),
            "minority CI": ci(v, "ci_minority"),
            "mean judge reward": v["mean_reward"],
            "DPO pairs": v.get("pairs", ""),
            "win rate at equal length": v.get("win_rate_lc", ""),
            "minority at equal length": v.get("win_rate_minority_lc", ""),
            "labeller accuracy (majority)": _or_blank(v.get("labeller_accuracy_majority")),
            "labeller accuracy (minority)": _or_blank(v.get("labeller_accuracy_minority")),
        }
        for m, by_n in r["policy"].items()
        for n, v in by_n.items()
    ]
    rl = r["rlhf"]
    prompts = max(v.get("prompts", 0) for by_n in r["policy"].values() for v in by_n.values())
    h2h = [
        {
            "policy": m,
            "n": n,
            "win rate": v["win_rate"],
            "95% CI": ci(v, "ci"),
            "reward diff": v["reward_diff"],
            "reward diff CI": ci(v, "reward_diff_ci"),
        }
        for m, by_n in rl["head_to_head"].items()
        for n, v in by_n.items()
    ]
    reference = r["rlhf_reference"]
    agreement = ", ".join(f"{m} {a:.3f}" for m, a in rl["judge"]["agreement"].items())
    hacking = [
        {"policy": m, **p} for m, points in rl.get("reward_hacking", {}).items() for p in points
    ]
    return (
        f"\n## Policy win rate against the base policy ({prompts} held-out prompts)\n"
        f"Judge: reward model trained on the {rl['judge']['pairs']} judge pairs only, test accuracy "
        f"{rl['judge']['accuracy']:.3f} (the minority's judge, {rl['judge']['minority_judge']}: "
        f"{rl['judge']['accuracy_minority']:.3f} on the minority's labels); agreement with each method's "
        f"labeller on the test pairs: {agreement}. The raw policy against itself ties on every prompt (0.5). "
        f"{base_line(rl['base']['sft'])}\n\n"
        + markdown_table(
            rows,
            [
                "policy",
                "n",
                "win rate vs base",
                "95% CI",
                "minority win rate",
                "minority CI",
                "mean judge reward",
                "DPO pairs",
                "win rate at equal length",
                "minority at equal length",
                "labeller accuracy (majority)",
                "labeller accuracy (minority)",
            ],
        )
        + f"\n\n## Policies against {reference}'s, on the same prompts (paired bootstrap over the "
        f"{prompts} prompts)\n"
        + markdown_table(
            h2h, ["policy", "n", "win rate", "95% CI", "reward diff", "reward diff CI"]
        )
        + "\n"
        + (
            "\n## Reward hacking: win rate against the base by DPO steps, its labellers' (proxy) and the judge's\n"
            + markdown_table(
                hacking,
                [
                    "policy",
                    "steps",
                    "proxy_win_rate",
                    "judge_win_rate",
                    "gap",
                    "judge_win_rate_minority",
                    "reply_words",
                    "mean_judge_reward",
                ],
            )
            + "\n"
            if hacking
            else ""
        )
    )


def _plot_accuracy(r: dict, out: RunOutput) -> None:
    names = list(r["selectors"])
    fig, ax, save = out.figure("selector_accuracy")
    for i, pop in enumerate(("majority", "minority")):
        ax.bar(
            [x + (i - 0.5) * 0.4 for x in range(len(names))],
            [r["selectors"][n][f"accuracy_{pop}"] for n in names],
            0.4,
            label=pop,
        )
    ax.axhline(0.5, color="grey", lw=0.8, ls="--", label="chance (0.5)")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_xlabel("selector")
    ax.set_ylabel("test accuracy (share of held-out pairs)")
    ax.set_title("Selector accuracy by population")
    ax.legend(fontsize=8)
    save()


def _plot_purity(r: dict, out: RunOutput) -> None:
    fig, ax, save = out.figure("group_purity")
    for name, groups in r["groups"].items():
        rounds = [g["round"] for g in groups]
        shares = np.array(
            [[np.nan if x is None else x for x in g["minority_share"]] for g in groups]
        )
        for u in range(shares.shape[1]):
            ax.plot(rounds, shares[:, u], marker="o", label=f"{name} selector {u}")
    ax.set_xlabel("round")
    ax.set_ylabel("minority share of the group's clients")
    ax.set_title("Group purity after each regroup")
    ax.legend(fontsize=8)
    save()


def _plot_reward_hacking(curves: dict, out: RunOutput) -> None:
    fig, ax, save = out.figure("reward_hacking")
    for i, (name, points) in enumerate(curves.items()):
        steps = [p["steps"] for p in points]
        ax.plot(
            steps,
            [p["proxy_win_rate"] for p in points],
            marker="o",
            ls="--",
            color=f"C{i}",
            label=f"{name} proxy",
        )
        ax.plot(
            steps,
            [p["judge_win_rate"] for p in points],
            marker="s",
            color=f"C{i}",
            label=f"{name} judge",
        )
    ax.axhline(0.5, color="grey", lw=0.8, ls=":", label="the base (0.5)")
    ax.set_xlabel("DPO steps")
    ax.set_ylabel("win rate against the base policy")
    ax.set_title("Reward hacking: labellers (proxy) vs judge")
    ax.legend(fontsize=8)
    save()
