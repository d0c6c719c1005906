"""What a reader sees of a results.json path: the measure's name and unit, declared once here for
every experiment's metrics, and a label built from the path's other components (the method, the
split), so a plot or a summary names ``routers.fedmix.overall.ehr`` "fedmix, overall: evidence
hit rate" instead of the raw path. A path whose measure is not in :data:`MEASURES` keeps its last
component, underscores as spaces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Measure:
    """A metric's name and unit as a reader sees them. ``count``: a non-negative count or
    amount (messages, bytes, seconds, turns): its interval is clipped at 0 where shown."""

    name: str
    unit: str = ""
    count: bool = False


SHARE = "share, 0 to 1"
RATE = "win rate, 0 to 1"
RETRIEVAL = "0 to 1"
TEXT = "0 to 100"
NLL = "nats per token"

MEASURES: dict[str, Measure] = {
    # FedTP (routing of evidence)
    "ehr": Measure("evidence hit rate", "share of turns"),
    "err": Measure("evidence-response relevance", "cosine, 0 to 1"),
    "support_ratio": Measure("support ratio", "share of turns"),
    "ehr_gain": Measure("EHR gain, FedMix - TF-IDF", "share of turns"),
    "ehr_gain_over_global": Measure("EHR gain, FedMix - global prior", "share of turns"),
    "bootstrap_ci_ehr_gain": Measure("EHR gain bootstrap bound, FedMix - TF-IDF", "share of turns"),
    "bootstrap_ci_ehr_gain_over_global": Measure(
        "EHR gain bootstrap bound, FedMix - global prior", "share of turns"
    ),
    "ehr_mean": Measure("evidence hit rate under DP (mean over noise draws)", "share of turns"),
    "mean_gain": Measure("mean per-conversation EHR gain", "share of turns"),
    "share": Measure("share of routing decisions changed", SHARE),
    "epsilon": Measure("privacy budget epsilon"),
    # FedBiscuit (preference selectors, policies)
    "accuracy": Measure("accuracy", SHARE),
    "accuracy_majority": Measure("accuracy, majority", SHARE),
    "accuracy_minority": Measure("accuracy, minority", SHARE),
    "win_rate": Measure("win rate", RATE),
    "win_rate_minority": Measure("win rate, minority", RATE),
    "judge_win_rate": Measure("judge win rate", RATE),
    "judge_win_rate_minority": Measure("judge win rate, minority", RATE),
    "proxy_win_rate": Measure("proxy win rate", RATE),
    "gap": Measure("proxy - judge win rate", "win rate difference"),
    "reward_diff": Measure("reward difference", "reward"),
    "reply_words": Measure("reply length", "words", count=True),
    "minority_share": Measure("minority share of a group", SHARE),
    # FedDTRE (dialogue)
    "bleu1": Measure("BLEU-1", TEXT),
    "bleu4": Measure("BLEU-4", TEXT),
    "rouge1": Measure("ROUGE-1", TEXT),
    "rouge2": Measure("ROUGE-2", TEXT),
    "trust_bertscore": Measure("trust (BERTScore)", RETRIEVAL),
    "gain_trust_bertscore": Measure("trust gain over the global model (BERTScore)", RETRIEVAL),
    "pii_rate": Measure("PII rate", "share of replies"),
    "personal_pii_rate": Measure("personal PII rate", "share of replies"),
    "personal_trust_bertscore": Measure("personal trust (BERTScore)", RETRIEVAL),
    "distance_to_global": Measure("distance to the global model", "L2"),
    "alpha": Measure("alpha (weight of the global model)", SHARE),
    "s_local": Measure("local model score", NLL),
    "s_global": Measure("global model score", NLL),
    # FedE4RAG (retrieval)
    "ndcg@10": Measure("NDCG@10", RETRIEVAL),
    "hit@1": Measure("hit@1", RETRIEVAL),
    "hit@10": Measure("hit@10", RETRIEVAL),
    "mrr@10": Measure("MRR@10", RETRIEVAL),
    "map@10": Measure("MAP@10", RETRIEVAL),
    "kd": Measure("KD term", "loss"),
    "infonce": Measure("InfoNCE", "loss"),
    "client-distance": Measure("client distance", "L2"),
    # training runs
    "loss": Measure("loss", "cross-entropy"),
    "train-loss": Measure("training loss", "cross-entropy"),
    "heldout_nll": Measure("held-out NLL", NLL),
    # bookkeeping
    "seconds": Measure("time", "s", count=True),
    "seconds_per_round": Measure("time per round", "s", count=True),
    "ms_per_client_round": Measure("time per client-round", "ms", count=True),
    "strategy_seconds": Measure("strategy time", "s", count=True),
    "bytes": Measure("bytes", "bytes", count=True),
    "turns": Measure("turns", "turns", count=True),
    "count": Measure("count", "", count=True),
}
# components a label leaves out: they name a table of results.json, not what a row is
STRUCTURE = {"methods", "routers", "selectors", "policy", "rlhf", "cells", "dp_sweep"}
# the last components of a bookkeeping path: counters of messages, bytes and time
COUNTS = ("sent", "accepted", "failed", "malformed", "timed_out", "bytes", "seconds", "_s")


def _measure_at(parts: list[str]) -> int | None:
    """The index of the component of ``parts`` that names the measure: the last one in
    :data:`MEASURES`, else the last that is not a number or a wildcard."""
    named = [i for i, p in enumerate(parts) if p in MEASURES]
    plain = [i for i, p in enumerate(parts) if p and not p.isdigit() and "*" not in p]
    return (named or plain or [None])[-1]


def measure(path: str) -> Measure:
    """The measure of a results.json path (or a family pattern) (:func:`_measure_at`); one not in
    :data:`MEASURES` as written (underscores as spaces), a count when it names messages, bytes or
    seconds (:data:`COUNTS`)."""
    parts = str(path).split(".")
    at = _measure_at(parts)
    last = parts[at] if at is not None else str(path)
    if last in MEASURES:
        return MEASURES[last]
    return Measure(last.replace("_", " "), count=any(w in last for w in COUNTS))


def context(path: str) -> str:
    """The components of ``path`` other than its measure and the names of results tables: what
    tells its rows apart (``routers.fedmix.overall.ehr``: "fedmix, overall")."""
    parts = str(path).split(".")
    at = _measure_at(parts)
    return ", ".join(
        p for i, p in enumerate(parts) if i != at and p not in STRUCTURE and "*" not in p
    )


def label(path: str) -> str:
    """``path`` as a reader names it: its context, then its measure."""
    where = context(path)
    return f"{where}: {measure(path).name}" if where else measure(path).name


def axis_label(path: str) -> str:
    """The measure of ``path`` with its unit, for an axis (one unit per axis)."""
    m = measure(path)
    return f"{m.name} ({m.unit})" if m.unit and m.unit != m.name else m.name
