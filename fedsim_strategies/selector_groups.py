"""FedBiscuit's server-side arithmetic (METHODS.md section 4), kept as pure numpy.

Clients' preferences differ, so one binary selector fits none of them well: FedBiscuit trains U
selectors and groups clients by which selector has the lowest validation loss on their data. Group
sizes are balanced so that no selector is starved of data or taken over by a majority.
Each selector is updated from its own group only, and the RLHF phase labels each pair by the
selectors' majority vote.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from fedsim.flower.strategies import sample_nodes
from fedsim.message_keys import SERVER_ROUND
from fedsim.runtime.messaging import Policy, Quorum, phase_grid
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.validators import Metrics, Number, like_model

log = logging.getLogger("fedsim")


def balanced_assignment(losses: np.ndarray, previous: np.ndarray | None = None) -> np.ndarray:
    """Assign each of M clients to one of U selectors: low validation loss, balanced group sizes.

    ``losses`` is (M, U); a row holding any NaN marks a client that did not report. ``previous``
    holds each client's previous selector, -1 where it was never grouped (None: nobody was).

    Reporting clients first take their lowest-loss selector. Then, greedily, the largest cluster
    still open is capped at its balanced share and closed; its extra clients move to their
    next-best selector that still has room (the lowest loss among selectors not yet closed).
    Which clients move out of a capped cluster: those whose move costs least, i.e. the smallest
    regret = loss at the best selector that still has room minus loss at the current one, so the
    total loss stays as low as this greedy procedure allows. It is greedy, not a global optimum:
    a closed cluster is never reopened, and no two clients are swapped.

    With M = q*U + r, the balanced shares are r clusters of q+1 and U-r of q. The q+1 slots go to
    the clusters capped first, i.e. the largest at the time, most in demand: keeping one more
    member there saves a move where most clients want to be, and the member kept is the one whose
    move would cost most. Ties (largest cluster, best selector, equal regrets) go to the lowest
    index; the result is deterministic.

    Non-reporters keep their previous selector and count toward its size. If they alone exceed a
    cluster's share, the cluster keeps them all, every reporting client moves out of it, and the
    shares of the clusters still open are re-derived from the clients left, so the rest is
    balanced among itself; a reporting client never ends in an over-full cluster. Never-grouped
    non-reporters then join the smallest cluster, one at a time.
    """
    losses, reporting, assign = _checked(losses, previous)
    assign[reporting] = np.argmin(losses[reporting], axis=1)
    _cap_largest_first(losses, assign, reporting)
    _join_smallest(assign, losses.shape[1])
    return assign


def _checked(losses, previous) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fail early on malformed input: a wrong shape here would silently mis-assign clients."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 2 or min(losses.shape) < 1:
        raise ValueError(
            f"losses must be a (clients, selectors) array with both >= 1, got shape {losses.shape}"
        )
    m, n_sel = losses.shape
    reporting = ~np.isnan(losses).any(axis=1)
    if not np.isfinite(losses[reporting]).all():
        raise ValueError("losses must be finite, or NaN in the rows of clients that did not report")
    if previous is None:
        return losses, reporting, np.full(m, -1, dtype=np.int64)
    previous = np.asarray(previous)
    if previous.shape != (m,) or not np.issubdtype(previous.dtype, np.integer):
        raise ValueError(
            f"previous must be an integer array of length {m}, got {previous.dtype} {previous.shape}"
        )
    if ((previous < -1) | (previous >= n_sel)).any():
        raise ValueError(f"previous selectors must lie in [-1, {n_sel - 1}]")
    return losses, reporting, previous.astype(np.int64)


def _sizes(assign: np.ndarray, n_sel: int) -> np.ndarray:
    return np.bincount(assign[assign >= 0], minlength=n_sel)


def _cap_largest_first(losses: np.ndarray, assign: np.ndarray, movable: np.ndarray) -> None:
    """Close clusters largest first at the share of the clients left; the extra movable ones go on."""
    m, n_sel = losses.shape
    is_open = np.ones(n_sel, dtype=bool)
    left = m  # clients not in a closed cluster, never-grouped non-reporters included
    while is_open.any():
        sizes = _sizes(assign, n_sel)
        u = int(np.argmax(np.where(is_open, sizes, -1)))
        is_open[u] = False
        cap = -(-left // (is_open.sum() + 1))  # ceil: the q+1 share while any is left
        members = np.flatnonzero((assign == u) & movable)
        n_out = min(sizes[u] - cap, len(members))
        if n_out > 0:  # never for the last open cluster: its cap is all the clients left
            _move_cheapest(losses, assign, members, n_out, is_open)
        left -= sizes[u] - max(n_out, 0)


def _move_cheapest(losses, assign, members, n_out, is_open) -> None:
    """Move the n_out members whose move to their best open selector raises the loss least."""
    open_losses = np.where(is_open, losses[members], np.inf)
    dest = np.argmin(open_losses, axis=1)
    regret = open_losses[np.arange(len(members)), dest] - losses[members, assign[members]]
    out = np.argsort(regret, kind="stable")[:n_out]
    assign[members[out]] = dest[out]


def _join_smallest(assign: np.ndarray, n_sel: int) -> None:
    """Never-grouped non-reporters carry no loss to go by, so they fill the smallest clusters."""
    for i in np.flatnonzero(assign < 0):
        assign[i] = np.argmin(_sizes(assign, n_sel))


def mix_selector(
    current: dict[str, np.ndarray], updates: list[tuple[dict[str, np.ndarray], float]]
) -> dict[str, np.ndarray]:
    """FedBiscuit's eq. 6 for one selector: phi <- (1 - sum p_m) phi + sum p_m phi^m.

    ``updates`` are (weights, p_m) of the cluster's clients that trained this round; p_m is the
    client's share of all clients' data, so a cluster holding little data moves its selector
    little, and the part of the selector no trained client speaks for stays as it was.
    """
    shares = [p for _, p in updates]
    total = math.fsum(shares)
    if not all(p >= 0 for p in shares) or not 0.0 <= total <= 1.0 + 1e-9:
        raise ValueError(
            f"data shares must be >= 0 and sum to at most 1, got {shares} (sum {total})"
        )
    for weights, _ in updates:
        if weights.keys() != current.keys():
            raise ValueError(
                f"update keys {sorted(weights)} differ from the selector's {sorted(current)}"
            )
        for key, value in current.items():
            if np.shape(weights[key]) != value.shape:
                raise ValueError(
                    f"update {key!r} has shape {np.shape(weights[key])}, selector has {value.shape}"
                )
    return {key: _mix(key, value, updates, total) for key, value in current.items()}


def _mix(key: str, value: np.ndarray, updates, total: float) -> np.ndarray:
    """Sum in float64 so many small shares do not lose precision; return the selector's dtype."""
    mixed = (1.0 - total) * value.astype(np.float64)
    for weights, p in updates:
        mixed += p * np.asarray(weights[key], dtype=np.float64)
    return mixed.astype(value.dtype)


def majority_vote(votes: np.ndarray) -> np.ndarray:
    """Label each pair by the majority of U selectors; U is odd so there is never a tie.

    ``votes`` is (U, N) of 0/1: which response of pair n selector u prefers.
    """
    votes = np.asarray(votes)
    if votes.ndim != 2 or votes.shape[0] % 2 == 0:
        raise ValueError(
            f"votes must be (selectors, pairs) with an odd number of selectors, got {votes.shape}"
        )
    if not np.isin(votes, (0, 1)).all():
        raise ValueError("votes must be 0 or 1")
    return (2 * votes.sum(axis=0) > votes.shape[0]).astype(np.int64)


@dataclass
class GroupsResult:
    """What a FedBiscuit run produced: the U selectors, the groups after every regroup, the
    aggregated train metrics per round, and the selectors as the warm-up left them (where the
    first grouping's lean comes from)."""

    selectors: list[ArrayRecord]
    groups: list[dict] = field(default_factory=list)
    train_metrics: dict[int, dict] = field(default_factory=dict)
    warmup: list[ArrayRecord] = field(default_factory=list)


class SelectorGroups(FedAvg):
    """FedBiscuit (METHODS.md section 4) as a Flower Message-API strategy over U models.

    Rounds ``1 .. U*warmup_rounds`` train selector u = (round-1) // warmup_rounds with FedAvg
    (FedBis) over sampled clients. From then on, every ``regroup_every`` rounds all clients get
    every selector (``<model_prefix><u>`` ArrayRecords of an EVALUATE message) and report their
    validation loss on each (``<loss_prefix><u>`` metrics); :func:`balanced_assignment` groups
    them. A regroup goes on with ``regroup_quorum`` of the clients: one that did not report keeps
    its group (never grouped: joins the smallest), counted in ``groups[i]["kept"]`` / ``"joined"``.
    Each round's sampled clients train their group's selector (``group_key`` in the config) and
    selector u becomes eq. 6 of its group's replies, p_m = the client's share of all clients'
    ``weighted_by_key`` (from the regroup reports: examples for data-share weights, or a metric
    that is 1 in every reply for the public code's uniform p_m = 1/M).

    ``fixed_groups`` (node id -> selector) with ``fixed_weights`` (node id -> p_m's numerator)
    skips the warm-up and the regroups: every round trains the given groups (an oracle grouping
    that knows the populations, to tell a failed grouping from a method that cannot win).

    Record and config keys are arguments, as in Flower's FedAvg: the strategy knows no task.
    """

    def __init__(
        self,
        num_selectors: int,
        warmup_rounds: int,
        regroup_every: int,
        regroup_quorum: float = 0.5,
        model_prefix: str = "model-",
        loss_prefix: str = "loss-",
        group_key: str = "group",
        fixed_groups: dict[int, int] | None = None,
        fixed_weights: dict[int, float] | None = None,
        **fedavg,
    ):
        super().__init__(**fedavg)
        if num_selectors < 1 or num_selectors % 2 == 0:
            raise ValueError(f"num_selectors must be odd (majority vote), got {num_selectors}")
        if (warmup_rounds < 1 or regroup_every < 1) and fixed_groups is None:
            raise ValueError("warmup_rounds and regroup_every must be >= 1")
        if fixed_groups is not None and (
            fixed_weights is None
            or set(fixed_weights) != set(fixed_groups)
            or set(fixed_groups.values()) - set(range(num_selectors))
        ):
            raise ValueError(
                "fixed_groups needs fixed_weights for the same nodes and selectors in "
                f"0..{num_selectors - 1}"
            )
        self.num_selectors, self.warmup_rounds, self.regroup_every = (
            num_selectors,
            warmup_rounds,
            regroup_every,
        )
        self.regroup_quorum = regroup_quorum
        self.model_prefix, self.loss_prefix, self.group_key = model_prefix, loss_prefix, group_key
        self.fixed = fixed_groups is not None
        self.groups: dict[int, int] = dict(fixed_groups or {})  # node id -> selector
        self.examples: dict[int, float] = dict(fixed_weights or {})  # node id -> p_m's numerator

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config=None,
        evaluate_fn=None,
    ) -> GroupsResult:
        warmup = 0 if self.fixed else self.num_selectors * self.warmup_rounds
        if num_rounds <= warmup:
            raise ValueError(
                f"num_rounds ({num_rounds}) must exceed the warm-up, {self.num_selectors} "
                f"selectors x {self.warmup_rounds} rounds"
            )
        # an update unlike the selectors (keys, shapes, dtypes) cannot be mixed into one: counted, not mixed
        grid = phase_grid(grid, "selector-groups", timeout).checked(
            MessageType.TRAIN, like_model(initial_arrays)
        )
        config = ConfigRecord() if train_config is None else train_config
        result = GroupsResult(
            [ArrayRecord(dict(initial_arrays.items())) for _ in range(self.num_selectors)]
        )
        for rnd in range(1, num_rounds + 1):
            start = time.perf_counter()
            if rnd <= warmup:
                self._warmup_round(rnd, (rnd - 1) // self.warmup_rounds, result, config, grid)
                if rnd == warmup:
                    result.warmup = [ArrayRecord(dict(s.items())) for s in result.selectors]
            else:
                if not self.fixed and (rnd - warmup - 1) % self.regroup_every == 0:
                    result.groups.append(self._regroup(rnd, result.selectors, config, grid))
                self._group_round(rnd, result, config, grid)
            log.info(
                "[%s] round %d/%d done in %.1f s",
                grid.label,
                rnd,
                num_rounds,
                time.perf_counter() - start,
            )
        return result

    def _train_config(self, config: ConfigRecord, rnd: int, group: int) -> ConfigRecord:
        return ConfigRecord({**dict(config.items()), SERVER_ROUND: rnd, self.group_key: group})

    def _warmup_round(self, rnd, u, result, config, grid) -> None:
        """FedBis on selector u: FedAvg over the sampled clients."""
        replies = grid.send_and_receive(
            self.configure_train(rnd, result.selectors[u], self._train_config(config, rnd, u), grid)
        )
        arrays, metrics = self.aggregate_train(rnd, replies)
        if arrays is not None:
            result.selectors[u] = arrays
        result.train_metrics[rnd] = {"selector": u, **(dict(metrics) if metrics else {})}

    def _group_round(self, rnd, result, config, grid) -> None:
        """The sampled clients train their group's selector; eq. 6 per selector."""
        nodes, _ = sample_nodes(grid, self.min_available_nodes, self._sample_size(grid))
        messages = [
            Message(
                RecordDict(
                    {
                        self.arrayrecord_key: result.selectors[self.groups[n]],
                        self.configrecord_key: self._train_config(config, rnd, self.groups[n]),
                    }
                ),
                dst_node_id=n,
                message_type=MessageType.TRAIN,
            )
            for n in nodes
        ]
        replies = list(grid.send_and_receive(messages))
        total = sum(self.examples.values())
        for u in range(self.num_selectors):
            mine = [r for r in replies if self.groups[r.metadata.src_node_id] == u]
            updates = [
                (
                    from_record(r.content[self.arrayrecord_key]),
                    self.examples[r.metadata.src_node_id] / total,
                )
                for r in mine
            ]
            if updates:
                current = from_record(result.selectors[u])
                result.selectors[u] = to_record(mix_selector(current, updates))
        result.train_metrics[rnd] = {
            "clients": len(replies),
            "groups-trained": sorted({self.groups[r.metadata.src_node_id] for r in replies}),
        }

    def _sample_size(self, grid) -> int:
        return max(int(len(list(grid.get_node_ids())) * self.fraction_train), self.min_train_nodes)

    def _regroup(self, rnd, selectors, config, grid) -> dict:
        """Every client's validation loss on every selector, then balanced groups; a regroup
        survives clients that crash or time out (quorum), they keep their group. Under a
        virtual clock only the clients online at the round's start are asked; every client of
        the population is grouped, those not asked as those that did not answer."""
        nodes = list(grid.population())  # in partition order: node ids are random per run
        asked = set(grid.get_node_ids())  # those online (all of them without a clock)
        content = {f"{self.model_prefix}{u}": s for u, s in enumerate(selectors)}
        messages = [
            Message(
                RecordDict(
                    {
                        **content,
                        self.configrecord_key: ConfigRecord(
                            {**dict(config.items()), SERVER_ROUND: rnd}
                        ),
                    }
                ),
                dst_node_id=n,
                message_type=MessageType.EVALUATE,
            )
            for n in nodes
            if n in asked
        ]
        replies = grid.exchange(
            "regroup", messages, Policy(Quorum(self.regroup_quorum), self._valid_report), rnd
        )
        losses = np.full((len(nodes), self.num_selectors), np.nan)
        row = {n: i for i, n in enumerate(nodes)}
        for reply in replies:
            metrics, node = (
                next(iter(reply.content.metric_records.values())),
                reply.metadata.src_node_id,
            )
            losses[row[node]] = [
                metrics[f"{self.loss_prefix}{u}"] for u in range(self.num_selectors)
            ]
            self.examples[node] = float(metrics[self.weighted_by_key])
        mean = np.mean(list(self.examples.values()))
        for n in nodes:
            self.examples.setdefault(n, mean)
        previous = np.array([self.groups.get(n, -1) for n in nodes])
        assign = balanced_assignment(losses, previous)
        missing = np.isnan(losses).any(axis=1)
        self.groups = {n: int(u) for n, u in zip(nodes, assign)}
        chosen = losses[np.arange(len(nodes)), assign]
        return {
            "round": rnd,
            "groups": dict(self.groups),
            "sizes": np.bincount(assign, minlength=self.num_selectors).tolist(),
            "reported": int((~missing).sum()),
            "kept": int((missing & (previous >= 0)).sum()),
            "joined": int((missing & (previous < 0)).sum()),
            "mean_loss": float(np.nanmean(chosen)) if (~missing).any() else None,
        }

    def _valid_report(self, content: RecordDict, node: int) -> str | None:
        """A regroup reply: one MetricRecord with a finite loss on every selector and a positive
        weight (a protocol bounds it by what the node declared: ``PhaseGrid.checked``)."""
        records = list(content.metric_records)
        if len(records) != 1 or set(content) != set(records):
            return "expected one MetricRecord"
        losses = {f"{self.loss_prefix}{u}": Number() for u in range(self.num_selectors)}
        metrics = Metrics({**losses, self.weighted_by_key: Number(math.ulp(0.0))})
        return metrics.problem(content[records[0]], node)
