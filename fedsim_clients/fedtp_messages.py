"""FedTP's message format: the record and config keys that the protocol
(``fedsim_experiments/fedtp/protocol.py``) and the client (``fedsim_clients/topic_preference.py``) exchange,
and what each phase's reply must be."""

from collections.abc import Callable

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from fedsim.message_keys import *  # noqa: F403 (the shared keys, re-exported: both ends read every key here)
from fedsim.message_keys import ARRAYS, METRICS, NUM_EXAMPLES
from fedsim.runtime.validators import (
    Arrays,
    Bound,
    Metrics,
    Number,
    Numbers,
    Reply,
    Texts,
    at,
    decoded,
    discovery_reply,
    weight,
)

# the shared keys as FedTP uses them: ARRAYS of a train reply; METRICS of train / evaluate replies,
# NUM_EXAMPLES in it the clients (train) or turns (evaluate) covered; INFO of the discovery reply,
# PARTITION_ID in it the node's partition

SPLITS = "splits"  # config: the conversations (splits) the message is about
TURN_LEVEL = "turn-level"  # config (evaluate): also return per-turn outcomes
VARIANT_NAMES = "variant-names"  # config (evaluate): router variants to score ...
VARIANT_PRIORS = "variant-priors"  # ... the prior each uses (a key of PRIORS, "" for none)
VARIANT_ALPHAS = "variant-alphas"  # ... its FedMix global weight
VARIANT_LAMBDAS = "variant-lambdas"  # ... its prior weight lambda
PRIORS = "priors"  # ArrayRecord (evaluate): released priors by name
VECTORS = "vectors"  # ARRAYS entry: (clients hosted, topics) preference rows
TURN_PREFIX = "turn/"  # METRICS keys with per-turn lists
INFO_SPLITS = "splits"  # INFO: the split of each hosted conversation
INFO_ROWS = "rows"  # INFO: the population row of each hosted conversation


# --- what each phase's reply must be (checked in the Messenger's screen: fedsim/runtime/validators.py) --


def discover_reply(
    partition_of: Callable[[int], int | None],
    partitions: int,
    hosted: Callable[[int], tuple[list[int], list[str]] | None],
) -> Reply:
    """The conversations a node hosts: its partition (the one it told at ``whoami``, where known)
    and the population rows and splits of its conversations, exactly those the public
    partitioning gives that partition (``hosted(partition)``; None where the server does not know
    the population's splits)."""

    def check(info: ConfigRecord, partition: int) -> str | None:
        want = hosted(partition)
        rows, splits = list(info[INFO_ROWS]), list(info[INFO_SPLITS])
        if len(rows) != len(splits):
            return f"{len(rows)} rows, {len(splits)} splits"
        return (
            None
            if want is None or (rows, splits) == (list(want[0]), list(want[1]))
            else "not the conversations its partition holds"
        )

    return discovery_reply(
        partition_of,
        partitions,
        {INFO_SPLITS: Texts(), INFO_ROWS: Numbers(Number(0, whole=True))},
        check,
    )


def train_reply(dim: int, rows: Bound) -> Reply:
    """A prior reply: a finite, non-negative (r, dim) matrix of preference rows, r at most
    ``rows`` (the node's conversations in the prior splits, or a DP strategy's bound), and
    ``num-examples`` (a weight strategy's weight) at most as many."""

    def check(content: RecordDict, node: int) -> str | None:
        vectors = decoded(VECTORS, content[ARRAYS][VECTORS])
        if isinstance(vectors, str) or set(content[ARRAYS]) != {VECTORS}:
            return f"expected only {VECTORS!r}"
        most = at(rows, node)
        if vectors.ndim != 2 or vectors.shape[1] != dim or not 1 <= vectors.shape[0] <= most:
            return f"{VECTORS} of shape {vectors.shape}, expected (1..{most:g}, {dim})"
        return "negative mass" if np.any(vectors < 0) else None

    return Reply({ARRAYS: Arrays(), METRICS: Metrics({NUM_EXAMPLES: weight(rows)})}, check=check)


def evaluate_reply(
    splits: list[str],
    variants: list[str],
    turn_level: bool,
    topics: int,
    rows: Callable[[int], list[int] | None],
) -> Reply:
    """An evaluation reply: per split hosted, its turns and every variant's hits (at most the
    turns), error and support sums (each turn's in [0, 1]); with ``turn_level`` every turn's
    outcome, all lists as long as the turns, of the node's own conversations (``rows(node)``)."""
    count, share, sums = Number(0, whole=True), Number(0.0), ("hits", "err", "support")
    per_split = {f"{s}/turns": count for s in splits} | {
        f"{s}/{v}/{m}": count if m == "hits" else share
        for s in splits
        for v in variants
        for m in sums
    }
    topic, unit = Number(0, topics - 1, whole=True), Number(0.0, 1.0)
    turns = {"gold": topic, "ambiguous": Number(0, 1, whole=True), "row": Number(0, whole=True)} | {
        f"{m}/{v}": topic if m == "pick" else unit
        for v in variants
        for m in ("pick", "err", "support")
    }

    def check(content: RecordDict, node: int) -> str | None:
        metrics = content[METRICS]
        total = sum(metrics.get(f"{s}/turns", 0) for s in splits)
        if any(
            metrics.get(f"{s}/{v}/{m}", 0) > metrics.get(f"{s}/turns", 0)
            for s in splits
            for v in variants
            for m in sums
        ):
            return "more hits, error or support than turns"
        if turn_level and any(len(metrics[TURN_PREFIX + k]) != total for k in turns):
            return f"turn lists not {total:g} long"
        own = rows(node)
        return (
            None
            if not turn_level or own is None or set(metrics[TURN_PREFIX + "row"]) <= set(own)
            else "turns of conversations it does not host"
        )

    required = {NUM_EXAMPLES: count} | (
        {TURN_PREFIX + k: Numbers(f) for k, f in turns.items()} if turn_level else {}
    )
    return Reply({METRICS: Metrics(required, per_split, informational=False)}, check=check)
