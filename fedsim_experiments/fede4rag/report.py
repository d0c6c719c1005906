"""FedE4RAG's report: the tables of ``summary.md`` and the plots, from a run's results (the
protocols that produced them: ``fedsim_experiments/fede4rag/protocol.py`` and ``kd_sweep.py``)."""

from __future__ import annotations

from fedsim.results.outputs import RunOutput, markdown_table, plain_log_scale
from fedsim_tasks.financebench_rag.retrieval import METRICS


def scored_in(method: dict) -> list[str]:
    """The evaluation labels in one method's results, in the order scored."""
    return [k for k, v in method.items() if isinstance(v, dict) and "questions" in v]


def cost_summary(rounds: list[dict]) -> dict:
    n = max(len(rounds), 1)
    mean = lambda key: sum(r.get(key, 0.0) for r in rounds) / n  # noqa: E731
    out = {
        "rounds": len(rounds),
        "bytes_per_client_round": mean("bytes-up-per-client"),
        "seconds_per_round": mean("round-seconds"),
    }
    if rounds and "encrypt-seconds-per-client" in rounds[0]:
        out |= {
            "aggregate_seconds_per_round": mean("aggregate-seconds"),
            "encrypt_seconds_per_client_round": mean("encrypt-seconds-per-client"),
            "decrypt_seconds_per_client_round": mean("decrypt-seconds-per-client"),
            "bytes_down_per_client_round": mean("bytes-down-per-client"),
        }
    return out


def summary(r: dict, out: RunOutput) -> str:
    columns = ["method", *METRICS]
    tables, labels = [], _labels(r)
    with_global = {
        name: m for name, m in r["methods"].items() if scored_in(m)
    }  # local_only has none
    for split in labels if with_global else []:
        rows = [{"method": name, **m[split]} for name, m in with_global.items()]
        first = next(iter(with_global.values()))[split]
        tables.append(
            f"## {split} ({first['questions']} questions, {first['corpus_pages']} "
            f"corpus pages)\n" + markdown_table(rows, columns)
        )
    local = [
        {
            "method": name,
            "split": split,
            "model": m["local"]["model"],
            **{
                k: f"{m['local'][split][k]:.4f} ± {m['local']['spread'][split][k]['std']:.4f}"
                for k in ("hit@10", "mrr@10", "ndcg@10", "recall@10")
            },
        }
        for name, m in r["methods"].items()
        if "local" in m
        for split in labels
    ]
    if local:
        tables.append(
            "## Each company's retriever (mean ± std over companies; `global`: the "
            "method keeps no local model)\n"
            + markdown_table(
                local, ["method", "split", "model", "hit@10", "mrr@10", "ndcg@10", "recall@10"]
            )
        )
    if per_client := _per_client_rows(r):
        tables.append(
            "## Each client's questions within its own filings, NDCG@10 (own: its retriever, "
            "localized RAG; others: its retriever on the other clients' questions; global: the "
            "global model; mean over clients, then each client's own)\n"
            + markdown_table(per_client, list(per_client[0]))
        )
    if drift := _drift_rows(r):
        tables.append(
            "## Per round (clients' means): client-distance = L2 of each client's weights to their "
            "mean, update-norm = to the model it started the round from (the global, or for "
            "local_only the initial model), both over the LoRA factors as sent; delta-: the same "
            "over what each LoRA pair adds (B @ A, which re-scaled or re-factored factors, as "
            "lora_aggregation=product's, leave as it is), kd-grad-ratio = |grad KD x weight| / "
            "|grad InfoNCE| at the round's last step\n" + markdown_table(drift, list(drift[0]))
        )
    if trajectory := _trajectory_rows(r):
        tables.append(
            "## NDCG@10 of the global model after each round (round 0: the untrained encoder)\n"
            + markdown_table(trajectory, list(trajectory[0]))
        )
    cost = [{"method": k, **v} for k, v in r["round_cost"].items()]
    if cost:
        tables.append(
            "## Round cost (mean per round)\n"
            + markdown_table(
                cost,
                [
                    "method",
                    "bytes_per_client_round",
                    "seconds_per_round",
                    "aggregate_seconds_per_round",
                    "encrypt_seconds_per_client_round",
                    "decrypt_seconds_per_client_round",
                ],
            )
        )
    plot(r, out)
    trajectory_plot(r, out)
    return (
        f"# FedE4RAG on FinanceBench\n\nBudget: {r['budget_steps']} optimizer steps per "
        f"trained method.\n\n" + "\n\n".join(tables) + "\n"
    )


def _labels(r: dict) -> list[str]:
    """The evaluation labels of the run: a global model's, else a company's own retriever's."""
    for m in r["methods"].values():
        if scored_in(m):
            return scored_in(m)
    return next(
        (
            scored_in(c)
            for m in r["methods"].values()
            for c in m.get("local", {}).get("clients", {}).values()
        ),
        [],
    )


def _per_client_rows(r: dict) -> list[dict]:
    rows = []
    for name, m in r["methods"].items():
        for split, metrics in m.get("local", {}).get("per_client", {}).items():
            ndcg = metrics["ndcg@10"]
            rows.append(
                {"method": name, "split": split}
                | {
                    k: f"{ndcg['mean'][k]:.4f}" if k in ndcg["mean"] else ""
                    for k in ("own", "others", "global")
                }
                | {f"own c{p}": f"{v:.4f}" for p, v in ndcg["own"].items()}
            )
    return rows


DRIFT = (
    "infonce",
    "kd",
    "kd-grad-ratio",
    "client-distance",
    "update-norm",
    "delta-client-distance",
    "delta-update-norm",
)


def _drift_rows(r: dict) -> list[dict]:
    return [
        {"method": name, "round": rnd} | {t: f"{stats[t]:.4g}" if t in stats else "" for t in DRIFT}
        for name, m in r["methods"].items()
        for rnd, stats in sorted(m.get("rounds", {}).items())
    ]


def trajectories(r: dict, split: str = "valid", metric: str = "ndcg@10") -> dict[str, dict]:
    """Each method evaluated after every round (``by_round``): round -> its ``split`` ``metric``,
    round 0 the untrained encoder's where ``vanilla`` ran (every method starts from it)."""
    start = r["methods"].get("vanilla", {}).get(split, {}).get(metric)
    return {
        name: ({0: start} if start is not None else {})
        | {int(k): v[split][metric] for k, v in m["by_round"].items() if split in v}
        for name, m in r["methods"].items()
        if m.get("by_round")
    }


def _trajectory_rows(r: dict) -> list[dict]:
    return [
        {"method": name, "split": split} | {f"round {k}": f"{v:.4f}" for k, v in sorted(t.items())}
        for split in _labels(r)
        for name, t in trajectories(r, split).items()
    ]


def trajectory_plot(r: dict, out: RunOutput) -> None:
    lines = trajectories(r)
    if not lines:
        return
    fig, ax, save = out.figure("ndcg_by_round")
    for name, t in lines.items():
        rounds = sorted(t)
        ax.plot(rounds, [t[k] for k in rounds], marker="o", label=name)
    ax.set_xlabel("federated round (0: the untrained encoder)")
    ax.set_ylabel("validation NDCG@10 of the global model (0 to 1)")
    ax.set_title("FinanceBench retrieval after each round")
    ax.legend(fontsize=7)
    save()


def plot(r: dict, out: RunOutput) -> None:
    names = [n for n, m in r["methods"].items() if scored_in(m)]
    if not names:
        return
    fig, ax, save = out.figure("retrieval_by_method")
    bars = [
        (split, metric)
        for metric in ("ndcg@10", "hit@10")
        for split in scored_in(r["methods"][names[0]])
    ]
    width = 0.8 / len(bars)
    for i, (split, metric) in enumerate(bars):
        ax.bar(
            [x + (i - (len(bars) - 1) / 2) * width for x in range(len(names))],
            [r["methods"][n][split][metric] for n in names],
            width,
            label=f"{split} {metric}",
        )
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_xlabel("method")
    ax.set_ylabel("retrieval score on test questions (0 to 1)")
    ax.set_title("FinanceBench retrieval by method")
    ax.legend(fontsize=8)
    save()


TERMS = ("infonce", "kd", "kd-first", "client-distance", "update-norm", "relative-distance")


def _last_round(cell: dict) -> dict:
    rounds = cell.get("rounds", {})
    return rounds[max(rounds)] if rounds else {}


def kd_sweep_summary(r: dict, out: RunOutput) -> str:
    every = {**r["methods"], **r["cells"]}
    labels = scored_in(next(iter(every.values())))
    rows = []
    for name, m in every.items():
        row = {
            "cell": name,
            "steps x rounds": f"{m['local_steps']} x {m['num_rounds']}"
            if "local_steps" in m
            else "-",
            "kd weight": m.get("kd_weight", "-"),
        }
        for label in labels:
            row |= {f"{label} {k}": m[label][k] for k in ("ndcg@10", "hit@1", "hit@10")}
        last = _last_round(m) if "local_steps" in m else {}
        row |= {t: f"{last[t]:.3g}" if t in last else "" for t in TERMS}
        rows.append(row)
    columns = list(rows[0])
    first = next(iter(every.values()))
    corpora = "; ".join(
        f"{label}: {first[label]['questions']} questions, {first[label]['corpus_pages']} pages"
        for label in labels
    )
    kd_sweep_plot(r, out)
    return (
        f"# FedE4RAG: local steps x KD weight\n\n{r['budget_steps_per_client']} optimizer steps "
        f"per client in every cell ({corpora}; `-filing`: each question searches its own "
        f"filing). Last round's means over the clients' steps: InfoNCE, KD term (unweighted; "
        f"kd-first: the first step's, same weights as the teacher), client distance (mean "
        f"L2 of each client's weights to their average), update norm, their ratio.\n\n"
        + markdown_table(rows, columns)
        + "\n"
    )


def kd_sweep_plot(r: dict, out: RunOutput) -> None:
    """Per cell, by optimizer steps done: the KD term and the client distance each round."""
    for term, what in (
        ("kd", "KD term (mean over the round's steps)"),
        ("client-distance", "client distance (mean L2 to their average)"),
    ):
        fig, ax, save = out.figure(f"{term}_by_round")
        for name, cell in r["cells"].items():
            rounds = sorted(cell.get("rounds", {}))
            y = [cell["rounds"][k].get(term) for k in rounds]
            if rounds and all(v is not None for v in y):
                ax.plot([k * cell["local_steps"] for k in rounds], y, marker="o", label=name)
        ax.set_xlabel("optimizer steps per client")
        ax.set_ylabel(what)
        ax.set_title(
            f"{what.split(' (')[0]} by optimizer steps, per cell (local steps x KD weight)"
        )
        plain_log_scale(ax)
        ax.legend(fontsize=8)
        save()
