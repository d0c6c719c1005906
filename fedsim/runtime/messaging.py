"""The one messaging path of every protocol phase: send, wait with progress, screen, count, meter.

A *phase* is a named exchange (``discover``, ``prior``, ``fedavg/train``,
``eval/fede4rag/encode``...). Every reply of every phase goes through :meth:`Messenger.exchange`:

- a reply that carries an error (the ClientApp raised) counts as ``failed``, one that did not
  arrive before the timeout as ``timed_out``, one that the phase's validator rejects, whose
  validator raises, whose metrics are not finite (``fedsim/runtime/validators.py``) or that the grid
  could not read (an Error with ``MALFORMED_CODE``) as ``malformed``, replies that claim one
  thing for their own (a partition) as ``duplicate``; all are left out and counted per phase and
  round in ``faults`` (``results.json``); nothing a client sends raises out of an exchange;
- bytes and seconds of each exchange are metered once, here, in ``traffic``;
- every completed exchange is journaled (``fedsim/runtime/journal.py``) and, on resume, replayed (its
  replies pass the phase's validator again);
- every exchange's row (clients, faults, seconds, bytes, the mean of the replies' metrics) goes
  to the run's metric sinks (``fedsim/results/sinks.py``: CSV, TensorBoard) as it completes;
- the phase's :class:`Policy` states whether it may go on with fewer replies: a
  :class:`Quorum` of accepted replies, below which :class:`PhaseFailed` stops the run.

Replies come back in the order their messages were sent, and :meth:`Messenger.node_ids` lists
the nodes in partition order once the partitions are known: what a strategy sums, and in which
order, then depends on the seed only, not on which reply arrived first or on Flower's node ids
(which are random per run).

Flower's own round loop (``Strategy.start``) calls ``grid.send_and_receive``; hand it a
:class:`PhaseGrid` (``messenger.grid(label, policy)``) and its train / evaluate exchanges take the
same path, as phases ``<label>/train`` and ``<label>/evaluate``.

Every node first tells its partition (``WHOAMI``, counted as phase ``whoami``); a node that
cannot, or claims a partition another node claims too, is left out of the federation.

Under a virtual clock (``Messenger.clock``, ``fedsim/clock/``) a PhaseGrid lists only the
clients online at the round's virtual start, and a training round's replies keep only the
updates that arrived by its close; stragglers and dropouts are added to the round's ``faults``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from omegaconf import DictConfig, OmegaConf

from fedsim import progress
from fedsim.clock.schedule import Task, VirtualClock
from fedsim.config.data import reads_data
from fedsim.config.node_local import sent_task
from fedsim.message_keys import NUM_EXAMPLES, SERVER_ROUND
from fedsim.results.sinks import Sinks, reply_metrics
from fedsim.runtime import exchange_trace
from fedsim.runtime.client_app import SEED_KEY, TASK_KEY
from fedsim.runtime.client_state import RUN_KEY, STATE_KEY
from fedsim.runtime.faults import FAULTS_KEY
from fedsim.runtime.journal import Journal, ResumeMismatch, ask_partitions
from fedsim.runtime.message_metadata import set_src_node_id
from fedsim.runtime.polling import Poller
from fedsim.runtime.sharded_grid import MALFORMED_CODE, ShardedGrid
from fedsim.runtime.validators import Validator, both, common_metrics, metric_values

log = logging.getLogger("fedsim")


@dataclass(frozen=True)
class Quorum:
    """A phase goes on when at least ``max(min_count, ceil(fraction * sent))`` replies (never
    more than were sent) are usable; below that the run stops."""

    fraction: float = 1.0
    min_count: int = 1

    def required(self, sent: int) -> int:
        return min(sent, max(self.min_count, math.ceil(self.fraction * sent)))


ALL = Quorum(1.0, 1)  # every addressed node must answer usefully
ANY = Quorum(0.0, 1)  # one usable reply is enough; the others are left out and counted
Ledger = Callable[
    [str, int, list[Message]], dict
]  # (phase, round, usable replies) -> columns of its sink row


@dataclass(frozen=True)
class Policy:
    """A phase's quorum, the check of each reply (``fedsim/runtime/validators.py``) and, where replies
    claim something for their own (a partition at discovery), ``claim``: what a reply claims;
    replies claiming the same are all refused (``duplicate``), so that none takes another's place.
    Where replies must agree on a setting no single reply may fix (HEFedAvg: the key, the model's
    size), ``agree``: the setting of a reply; those outside the strict majority are ``malformed``
    (a tie refuses every reply: no one reply decides)."""

    quorum: Quorum = ALL
    validator: Validator | None = None
    claim: Callable[[RecordDict], Hashable] | None = None
    agree: Callable[[RecordDict], Hashable] | None = None


class PhaseFailed(RuntimeError):
    """A phase got fewer usable replies than its quorum; the message names phase and counts."""


def client_config(cfg: DictConfig) -> dict:
    """The config entries every client message carries: the resolved task (without the folders
    each node chooses for itself, ``fedsim/config/node_local.py``), the fault spec, the run's seed (the
    ClientApp reseeds each handler from it), the run's key (:func:`run_key_of`), under which
    clients keep state between rounds, and whether they keep it after the run
    (``fedsim/runtime/client_state.py``)."""
    task = sent_task(OmegaConf.to_container(cfg.task, resolve=True), reads_data(cfg.task))
    return {
        TASK_KEY: json.dumps(task),
        FAULTS_KEY: json.dumps(OmegaConf.to_container(cfg.faults)),
        SEED_KEY: int(cfg.seed),
        RUN_KEY: run_key_of(cfg),
        STATE_KEY: json.dumps({"keep": bool(cfg.client_state.keep)}),
    }


def run_key_of(cfg: DictConfig) -> str:
    """The key the ServerApp drew for the run (``client_state.run_key``: new for every fresh
    run, the same when it is resumed, unlike Flower's run id); a protocol driven without the
    ServerApp (in-process tests) uses its results folder's hash."""
    return (
        cfg.client_state.get("run_key")
        or hashlib.sha256(str(cfg.results_dir).encode()).hexdigest()[:16]
    )


def payload_bytes(content: RecordDict) -> int:
    """Bytes a message carries as data: array buffers and ``bytes`` config values, alone or in
    a list (SecAgg+'s keys, ciphertexts and shares). One pass over the records (a RecordDict's
    ``array_records`` and ``config_records`` each build a new dict)."""
    total = 0
    for record in content.values():
        if isinstance(record, ArrayRecord):
            total += sum(len(a.data) for a in record.values())
        elif isinstance(record, ConfigRecord):
            total += sum(
                len(b)
                for v in record.values()
                for b in (v if isinstance(v, list) else [v])
                if isinstance(b, bytes)
            )
    return total


def _sizes(messages: list[Message]) -> dict[int, int]:
    """The payload bytes of each of ``messages``' contents, by ``id``, each content measured
    once: a strategy sends one content object to every client it samples (100,000 measurements
    of one model otherwise)."""
    sizes: dict[int, int] = {}
    for m in messages:
        if id(m.content) not in sizes:
            sizes[id(m.content)] = payload_bytes(m.content)
    return sizes


def _sent_bytes(messages: list[Message]) -> int:
    """The payload bytes of ``messages``."""
    sizes = _sizes(messages)
    return sum(sizes[id(m.content)] for m in messages)


def _num_examples(content: RecordDict) -> float:
    """How many clients / examples a reply stands for (FedAvg's weight key; 1 if absent). Its
    metrics are finite (screened); a list is no count."""
    for record in content.values():
        if isinstance(record, MetricRecord) and isinstance(record.get(NUM_EXAMPLES), (int, float)):
            return float(record[NUM_EXAMPLES])
    return 1.0


def _round_of(messages: list[Message]) -> int:
    """The server round a strategy's messages belong to (Flower puts it in their config)."""
    for record in messages[0].content.config_records.values():
        if SERVER_ROUND in record:
            return int(record[SERVER_ROUND])
    return 1


class Messenger:
    """Sends through ``grid``; keeps ``faults`` and ``traffic`` as ``{phase: {round: {...}}}``.
    Every exchange's usable replies (live or replayed) also go to each of ``ledgers``
    (``ledger(phase, round, replies)``: the privacy plan's DP-SGD account,
    ``fedsim/privacy/plan.py``), whose returned columns join the exchange's sink row. Replies are
    pulled at most ``poll_seconds`` apart, sooner where a pull is cheap
    (``fedsim/runtime/polling.py``)."""

    def __init__(
        self,
        grid: Grid,
        timeout: float,
        poll_seconds: float = 0.1,
        report_seconds: float = 10.0,
        journal: Journal | None = None,
        sinks: Sinks | None = None,
        ledgers: Iterable[Ledger] = (),
        know_partitions: bool = False,
    ):
        self.raw = grid
        self.ledgers = list(ledgers)
        self.timeout = timeout
        self.poll_seconds = poll_seconds
        self.report_seconds = report_seconds
        self.journal, self.sinks = journal, sinks or Sinks()
        self.faults: dict[str, dict[int, dict[str, int]]] = {}
        self.traffic: dict[str, dict[int, dict[str, float]]] = {}
        self._to_new: dict[int, int] = {}  # on resume: the journaled run's node ids -> this run's
        self._to_old: dict[int, int] = {}  # and back
        self.partitions: dict[int, int] = {}  # node id (as the protocol sees it) -> partition
        self.ray_nodes: dict[
            str, int
        ] = {}  # Ray node id -> the clients whose whoami it served (simulation)
        self.clock: VirtualClock | None = None  # the run's virtual clock (fedsim/clock/)
        self._listed: tuple[tuple, list[int]] | None = None  # the grid's nodes -> node_ids()
        # a population -> its partitions sorted and their nodes (in_partition_order)
        self._ordered: tuple[list[int], np.ndarray, np.ndarray] | None = None
        if journal is not None or know_partitions:
            self._map_nodes(journal)

    def _map_nodes(self, journal: Journal | None) -> None:
        """Ask every node its partition (not journaled; counted as phase ``whoami``: a node left
        out takes no part in the run); a resumed run maps the journaled run's node ids to this
        run's by partition."""
        self.partitions = partitions = self._whoami()
        if journal is None:
            return
        if journal.resumed_from == 0:
            journal.save_partitions(partitions)
            return
        by_partition = {p: n for n, p in partitions.items()}
        self.partitions = old = journal.load_partitions()
        missing = sorted(set(old.values()) - set(by_partition))
        if missing:
            raise PhaseFailed(f"resume: partitions {missing} of the journaled run have no node now")
        self._to_new = {o: by_partition[p] for o, p in old.items()}
        self._to_old = {n: o for o, n in self._to_new.items()}

    def _whoami(self) -> dict[int, int]:
        sharded = isinstance(self.raw, ShardedGrid)
        if sharded and self.raw.reply_rows:  # placed by the server, no message per client
            partitions, counts, self.ray_nodes = self.raw.hosted()
        else:
            partitions, counts, self.ray_nodes = ask_partitions(
                self.raw, self.timeout, self.poll_seconds, self.raw.placed() if sharded else None
            )
        counts["examples"] = counts["accepted"]
        self._record(self.faults, "whoami", 1, counts)
        if not partitions:
            raise PhaseFailed(f"whoami: no node told a partition of its own ({counts})")
        return partitions

    def node_ids(self) -> list[int]:
        """The nodes, in partition order where the partitions are known (those that told one of
        their own; else every node as the grid lists them)."""
        listed = list(self.raw.get_node_ids())
        key = (listed, id(self.partitions), id(self._to_old))
        if self._listed is None or self._listed[0] != key:  # a round asks twice: sorted once
            nodes = listed
            if self._to_old:
                nodes = [self._to_old[n] for n in nodes if n in self._to_old]
            if self.partitions:
                nodes = [n for n in nodes if n in self.partitions]
            self._listed = key, sorted(nodes, key=lambda n: self.partitions.get(n, -1))
        return list(self._listed[1])

    def in_partition_order(self, nodes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The partitions of ``nodes``, sorted, and their nodes (arrays); the last population
        asked is kept: a clock's round asks it twice, and a Python lookup of each of 10,000
        clients every round was most of what a clock added to a round
        (``bench/clock_overhead.py``)."""
        if self._ordered is None or self._ordered[0] != nodes:
            order = sorted((self.partition_of(n), n) for n in nodes)
            self._ordered = (
                list(nodes),
                np.array([p for p, _ in order], dtype=np.int64),
                np.array([n for _, n in order], dtype=np.uint64),
            )
        return self._ordered[1], self._ordered[2]

    def partition_of(self, node: int) -> int | None:
        """The partition ``node`` told at ``whoami`` (None where the partitions are not asked)."""
        return self.partitions.get(node)

    @property
    def num_partitions(self) -> int:
        """The federation's partitions: one per node the grid lists (``num-partitions`` of every
        node's config)."""
        return len(list(self.raw.get_node_ids()))

    def grid(
        self,
        label: str,
        policy: Policy = Policy(ANY),
        nodes: Iterable[int] | None = None,
        need: int = 1,
    ) -> PhaseGrid:
        """A Grid for a Strategy's own round loop: ``nodes`` (default all) are its population;
        under a virtual clock a round starts once ``need`` of them are online."""
        return PhaseGrid(self, label, policy, None if nodes is None else list(nodes), need=need)

    def exchange(
        self,
        phase: str,
        messages: Iterable[Message],
        policy: Policy = Policy(),
        server_round: int = 1,
        timeout: float | None = None,
    ) -> list[Message]:
        """Send ``messages``, return the usable replies; count the rest; enforce the quorum."""
        messages = list(messages)
        if not messages:
            return []
        if self.journal is not None and self.journal.replaying:
            entry = self.journal.replay(phase, server_round)
            self._revalidate(phase, server_round, entry["replies"], policy)
            return self._done(
                phase, server_round, entry["replies"], entry["faults"], entry["traffic"]
            )
        start = time.monotonic()
        replies = self._send_and_wait(
            phase,
            server_round,
            self._to_this_run(messages),
            self.timeout if timeout is None else timeout,
        )
        seconds = time.monotonic() - start
        good, counts, first_error = self._screen(
            phase, server_round, len(messages), replies, policy
        )
        traffic = {
            "messages": len(messages),
            "seconds": seconds,
            "bytes_down": _sent_bytes(messages),
            "bytes_up": sum(payload_bytes(m.content) for m in replies if not m.has_error()),
        }
        need = policy.quorum.required(len(messages))
        if len(good) < need:
            self._done(phase, server_round, good, counts, traffic)
            raise PhaseFailed(
                f"{phase} round {server_round}: {len(good)} of {len(messages)} "
                f"replies usable, {need} needed ({counts})"
                + (f"; e.g. {first_error}" if first_error else "")
            )
        if self.journal is not None:
            self.journal.record(phase, server_round, good, counts, traffic)
        return self._done(phase, server_round, good, counts, traffic)

    def _done(
        self, phase: str, server_round: int, good: list[Message], counts: dict, traffic: dict
    ) -> list[Message]:
        """Count an exchange (live or replayed) and hand its row to the sinks."""
        self._record(self.faults, phase, server_round, counts)
        self._record(self.traffic, phase, server_round, traffic)
        kept = {
            k: v for ledger in self.ledgers for k, v in ledger(phase, server_round, good).items()
        }
        self.sinks.write(phase, server_round, {**counts, **traffic, **reply_metrics(good), **kept})
        return good

    @staticmethod
    def _revalidate(phase: str, server_round: int, replies: list[Message], policy: Policy) -> None:
        """Replayed replies pass the phase's validator again, as they did live: a validator may
        hold state the strategy needs (HEFedAvg adopts the clients' public context there)."""
        for msg in replies:
            if why := _problem(msg, policy.validator):
                raise ResumeMismatch(
                    f"{phase} round {server_round}: a journaled reply is now "
                    f"rejected ({why}); was the code or the config changed?"
                )

    def _to_this_run(self, messages: list[Message]) -> list[Message]:
        """On resume, address the journaled run's node ids to this run's nodes (and map the
        replies back in :meth:`_send_and_wait`)."""
        for m in messages:
            m.metadata.dst_node_id = self._to_new.get(
                m.metadata.dst_node_id, m.metadata.dst_node_id
            )
        return messages

    def _send_and_wait(
        self, phase: str, server_round: int, messages: list[Message], timeout: float
    ) -> list[Message]:
        """The replies that arrived in time, in the order their messages were sent."""
        pushed = time.time()
        sent = list(self.raw.push_messages(messages))
        for mid in sent:
            exchange_trace.mark("push", mid, phase=phase, round=server_round, t=pushed)
        pending, position = set(sent), {mid: i for i, mid in enumerate(sent)}
        total, replies = len(pending), []
        start = last = time.monotonic()
        poller = Poller(self.poll_seconds)
        while pending and time.monotonic() - start < timeout:
            got = poller.pull(self.raw.pull_messages, pending)
            for m in got if self._to_old else ():  # back to the journaled run's node ids (resume)
                set_src_node_id(m, self._to_old[m.metadata.src_node_id])
            replies.extend(got)
            for m in got:
                exchange_trace.mark("reply", m.metadata.reply_to_message_id)
            pending.difference_update(m.metadata.reply_to_message_id for m in got)
            now = time.monotonic()
            if pending and now - last >= self.report_seconds:
                log.info("%s", progress.line(phase, total - len(pending), total, now - start))
                last = now
            if pending:
                poller.pause()
        log.info(
            "[%s] %d/%d replies in %.1f s%s",
            phase,
            len(replies),
            total,
            time.monotonic() - start,
            f" ({len(pending)} timed out)" if pending else "",
        )
        return sorted(replies, key=lambda m: position[m.metadata.reply_to_message_id])

    @staticmethod
    def _screen(phase: str, server_round: int, sent: int, replies: list[Message], policy: Policy):
        good, counts, first_error = [], {"sent": sent, "failed": 0, "malformed": 0}, ""
        # in the order sent (partitions), not arrival order nor node ids (random per run): what
        # a validator keeps (HEFedAvg: the public contexts it builds) must not depend on which
        # node answered first
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error() and msg.error.code == MALFORMED_CODE:  # the grid could not read it
                counts["malformed"] += 1
                reason = f"node {node} rejected: {msg.error.reason!r}"
            elif msg.has_error():
                counts["failed"] += 1
                reason = (
                    f"node {node} failed: {msg.error.reason!r}"  # repr: one line, whatever it holds
                )
            elif why := _problem(msg, policy.validator):
                counts["malformed"] += 1
                reason = f"node {node} rejected: {why!r}"
            else:
                good.append(msg)
                continue
            first_error = first_error or reason
            log.warning("%s round %d: %s", phase, server_round, reason)
        if policy.claim is not None:
            good, refused, counts["duplicate"] = _claims(good, policy.claim)
            counts["malformed"] += len(refused) - counts["duplicate"]
            for reason in refused:
                first_error = first_error or reason
                log.warning("%s round %d: %s", phase, server_round, reason)
        if policy.agree is not None:
            good, refused = _agreeing(good, policy.agree)
            counts["malformed"] += len(refused)
            for reason in refused:
                first_error = first_error or reason
                log.warning("%s round %d: %s", phase, server_round, reason)
        counts["timed_out"] = max(0, sent - len(replies))
        counts["accepted"] = len(good)
        counts["examples"] = int(sum(_num_examples(m.content) for m in good))
        if counts["timed_out"]:
            log.warning(
                "%s round %d: %d node(s) did not reply in time",
                phase,
                server_round,
                counts["timed_out"],
            )
            first_error = first_error or f"{counts['timed_out']} node(s) timed out"
        return good, counts, first_error

    @staticmethod
    def _record(table: dict, phase: str, server_round: int, values: dict) -> None:
        """Add ``values`` to the phase's row for the round (a phase may exchange repeatedly)."""
        row = table.setdefault(phase, {}).setdefault(server_round, {})
        for key, value in values.items():
            row[key] = row.get(key, 0) + value

    def count(self, phase: str, server_round: int, **faults: int) -> None:
        """Add faults found after an exchange screened its replies (SecAgg+: a share a node's
        neighbour could not decrypt; the clock's stragglers and dropouts) to its counts."""
        self._record(self.faults, phase, server_round, faults)

    def round_traffic(self, phase: str, server_round: int) -> dict[str, float]:
        return dict(self.traffic.get(phase, {}).get(server_round, {}))


def _problem(msg: Message, validator: Validator | None) -> str | None:
    """Why a reply is malformed: metrics that are not finite numbers, or its phase's validator
    says so, or raises on it (a validator is code reading what a client sent)."""
    try:
        return metric_values(msg.content) or (
            validator and validator(msg.content, msg.metadata.src_node_id)
        )
    except Exception as exc:  # noqa: BLE001 - a validator that raises counts the reply malformed
        return f"its check raised {type(exc).__name__}: {exc!s:.200}"


def _claims(
    replies: list[Message], claim: Callable[[RecordDict], Hashable]
) -> tuple[list[Message], list[str], int]:
    """The replies making a claim no other reply makes; why each other one is refused; how many
    of those made a claim another reply makes too (the rest make none that can be read)."""
    claims = []
    for msg in replies:
        try:
            claims.append(claim(msg.content))
        except Exception:  # noqa: BLE001 - a reply without a readable claim
            claims.append(None)
    taken = Counter(c for c in claims if c is not None)
    refused = [
        f"node {m.metadata.src_node_id} refused: "
        + (
            "makes no claim that can be read"
            if c is None
            else f"claims {c!r:.80}, as {taken[c]} nodes do"
        )
        for m, c in zip(replies, claims)
        if c is None or taken[c] > 1
    ]
    kept = [m for m, c in zip(replies, claims) if c is not None and taken[c] == 1]
    return kept, refused, sum(c is not None and taken[c] > 1 for c in claims)


def _agreeing(
    replies: list[Message], agree: Callable[[RecordDict], Hashable]
) -> tuple[list[Message], list[str]]:
    """The replies of the setting most replies share (strictly), and why each other one is refused."""
    settings = []
    for msg in replies:
        try:
            settings.append(agree(msg.content))
        except Exception:  # noqa: BLE001 - a validated reply has its setting; this one has none
            settings.append(None)
    ranked = Counter(s for s in settings if s is not None).most_common(2)
    chosen = ranked[0][0] if ranked and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]) else None
    refused = [
        f"node {m.metadata.src_node_id} refused: its setting {s!r:.80} is not the majority's"
        for m, s in zip(replies, settings)
        if chosen is None or s != chosen
    ]
    return [m for m, s in zip(replies, settings) if chosen is not None and s == chosen], refused


class PhaseGrid(Grid):
    """A Grid view for Flower's ``Strategy.start``: ``send_and_receive`` is a
    :meth:`Messenger.exchange` under ``<label>/<message type>`` with the view's policy, and
    ``get_node_ids`` is the view's population (e.g. the prior clients of FedTP)."""

    def __init__(
        self,
        messenger: Messenger,
        label: str,
        policy: Policy,
        nodes: list[int] | None,
        checks: dict[str, Validator] | None = None,
        need: int = 1,
    ):
        self.messenger, self.label, self.policy, self._nodes = messenger, label, policy, nodes
        self.need = need  # under a virtual clock: the clients a round waits to have online
        self._checks = (
            checks or {}
        )  # sub-phase (a message type, or a strategy's own) -> a further check

    def checked(self, suffix: str, validator: Validator) -> PhaseGrid:
        """This view, the replies of its sub-phase ``suffix`` (a message type of Flower's loop, or
        a strategy's own exchange: ``regroup``, HEFedAvg's ``train``) also passing ``validator``:
        a protocol's schema of that reply with its per-node bounds, or a strategy's own check
        (the shapes of the model it sent). A reply failing it is counted, not averaged."""
        return PhaseGrid(
            self.messenger,
            self.label,
            self.policy,
            self._nodes,
            {**self._checks, suffix: both(self._checks.get(suffix), validator)},
            self.need,
        )

    def _policy(self, message_type: str) -> Policy:
        return self._with_checks(message_type, self.policy)

    def _with_checks(self, suffix: str, policy: Policy) -> Policy:
        """``policy`` with the view's checks of ``suffix`` first: a strategy's own validator may
        keep state from the replies it accepts (HEFedAvg: their public contexts), so it sees only
        replies every other check accepted."""
        extra = self._checks.get(suffix)
        return (
            policy
            if extra is None
            else Policy(policy.quorum, both(extra, policy.validator), policy.claim, policy.agree)
        )

    def exchange(
        self, suffix: str, messages: Iterable[Message], policy: Policy, server_round: int
    ) -> list[Message]:
        """A sub-phase of this view's label (e.g. HEFedAvg's ``<label>/he-encrypt``), its replies
        also passing the checks the view holds for ``suffix``."""
        return self.messenger.exchange(
            f"{self.label}/{suffix}", messages, self._with_checks(suffix, policy), server_round
        )

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Flower's exchange; the replies keep only the informational metric keys they all carry
        (Flower's strategies raise on replies whose keys differ)."""
        messages = list(messages)
        if not messages:
            return []
        message_type = messages[0].metadata.message_type
        clock = self.messenger.clock if message_type == MessageType.TRAIN else None
        if clock is None:
            return common_metrics(self.dispatch(messages, _round_of(messages), timeout))
        return common_metrics(self._on_clock(clock, messages, timeout))

    def dispatch(
        self, messages: list[Message], server_round: int, timeout: float | None = None
    ) -> list[Message]:
        """The usable replies to ``messages``, all of them, whatever the clock says (an
        asynchronous strategy schedules them itself)."""
        message_type = messages[0].metadata.message_type
        return self.messenger.exchange(
            f"{self.label}/{message_type}",
            messages,
            self._policy(message_type),
            server_round,
            timeout,
        )

    def bytes_down(self, messages: list[Message]) -> dict[int, int]:
        """Each message's payload by its client's partition (read before the exchange: a
        resumed run readdresses the messages it sends)."""
        sizes = _sizes(messages)
        return {
            self.messenger.partition_of(m.metadata.dst_node_id): sizes[id(m.content)]
            for m in messages
        }

    def tasks(self, down: dict[int, int], replies: list[Message]) -> list[Task]:
        """Each reply's work as the clock times it: its examples, the bytes of its message
        (``down``, by partition) and its own."""
        tasks = []
        for reply in replies:
            partition = self.messenger.partition_of(reply.metadata.src_node_id)
            tasks.append(
                Task(
                    partition,
                    _num_examples(reply.content),
                    down[partition],
                    payload_bytes(reply.content),
                )
            )
        return tasks

    def _on_clock(
        self, clock: VirtualClock, messages: list[Message], timeout: float | None
    ) -> list[Message]:
        """A synchronous round on the virtual clock: every sampled client trains, the clock
        says whose updates arrived by the round's close; stragglers and dropouts are counted
        (``faults``) and left out."""
        server_round = _round_of(messages)
        phase = f"{self.label}/{MessageType.TRAIN}"
        down = self.bytes_down(messages)
        replies = self.dispatch(messages, server_round, timeout)
        accepted = clock.close_round(phase, server_round, self.tasks(down, replies), len(messages))
        entry = clock.rounds[-1]
        self.messenger.count(
            phase, server_round, stragglers=entry["stragglers"], dropouts=entry["dropouts"]
        )
        return [
            r for r in replies if self.messenger.partition_of(r.metadata.src_node_id) in accepted
        ]

    def population(self) -> list[int]:
        """Every node of this view, online or not."""
        return self.messenger.node_ids() if self._nodes is None else list(self._nodes)

    def get_node_ids(self) -> Iterable[int]:
        nodes = self.population()
        clock = self.messenger.clock
        if clock is None:
            return nodes
        partitions, by_partition = self.messenger.in_partition_order(nodes)
        return by_partition[clock.wait_mask(partitions, self.need)].tolist()

    def set_run(self, run) -> None:
        self.messenger.raw.set_run(run)

    @property
    def run(self):
        return self.messenger.raw.run

    def create_message(self, *args, **kwargs) -> Message:
        return self.messenger.raw.create_message(*args, **kwargs)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        raise NotImplementedError("a PhaseGrid sends through its Messenger (send_and_receive)")

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        raise NotImplementedError("a PhaseGrid sends through its Messenger (send_and_receive)")


def phase_grid(grid: Grid, label: str, timeout: float = 3600.0) -> PhaseGrid:
    """``grid`` itself when it already is a view (inside a protocol), else a view over a new
    Messenger (a strategy used on a plain Grid, e.g. in tests)."""
    if isinstance(grid, PhaseGrid):
        return grid
    return Messenger(grid, timeout).grid(label)
