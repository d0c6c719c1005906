"""SecAgg+ as a wrapper around any strategy that needs only the weighted sum of the updates
(FedAvg, FedProx, FedAvgM, FedAdam, FedYogi, FedAdagrad): the server learns that sum, never one
client's update. The protocol: ``fedsim/privacy/secagg/protocol.py``; the client layer:
``fedsim/runtime/secagg_layer.py``.

Flower's own round loop runs (``Strategy.start``: the wrapped strategy's sampling, train config,
aggregation, evaluation); its grid is a :class:`SecAggGrid`, which turns the train exchange of a
round into SecAgg+'s five, each a phase of the one messaging path (faults and bytes counted per
phase and round): ``<label>/secagg-keys``, ``<label>/secagg-share``, ``<label>/train`` (the
strategy's train messages, masked replies), ``<label>/secagg-check``, ``<label>/secagg-unmask``.
A client's unmask reply carries the public keys of its next round, so the key exchange goes only
to clients the server holds no such keys of (:meth:`RoundRun._advertise`).
It hands the strategy one reply: the unmasked weighted mean, weighing the sum of the live
clients' weights, so the strategy's aggregate (and its server step) is that mean's.

What a client encodes is the mask stage's config (:meth:`RoundRun.mask_config`) and what the
server makes of the sum :meth:`RoundRun._aggregate_reply`: ``fedsim_strategies/secagg_ddp.py``
overrides both (DPMean as distributed DP).

Why not Flower's ``SecAggPlusWorkflow``: it drives legacy strategies through ``LegacyContext``
and fit messages; fedsim's strategies run on the Message API (issue 64).
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedsim.flower.secure_aggregation import bytes_to_public_key, verify_signature
from fedsim.flower.strategies import aggregate_metricrecords
from fedsim.message_keys import ARRAYS, NUM_EXAMPLES
from fedsim.privacy.secagg import messages as keys
from fedsim.privacy.secagg import protocol, wire
from fedsim.runtime.client_app import SEED_KEY
from fedsim.runtime.he_layer import unflatten
from fedsim.runtime.messaging import ANY, PhaseFailed, PhaseGrid, Policy, phase_grid
from fedsim.runtime.records import from_record, to_record
from fedsim.runtime.validators import Blob, Config, Metrics, Number, Reply, decoded
from fedsim_strategies.wrapper import StrategyWrapper

log = logging.getLogger("fedsim")

KEY_BYTES = 1024  # a PEM EC public key (P-256: 178 bytes)
TOKEN_BYTES = 8192  # a Fernet token of two shares (~300 bytes), a share, a signature


def ids_of(count: int) -> Blob:
    """At most ``count`` node ids, packed (``wire.ids``)."""
    return Blob(8 * count)


def blobs_of(count: int, size: int) -> Blob:
    """At most ``count`` items of at most ``size`` bytes, packed (``wire.blobs``)."""
    return Blob(4 + (4 + size) * count)


class SecAggPlus(StrategyWrapper):
    """``strategy``'s sampling and aggregation, its train replies summed under SecAgg+.

    ``degree``: each node's neighbours (even; null: every sampled node, SecAgg);
    ``threshold``: t as a share of a neighbourhood (t is the largest whole number not above
    ``threshold x size``, plus one: more than half); ``clip_range``: c, each value of a
    client's weighted update (its update times weight / ``max_weight``) clipped to [-c, c];
    ``max_weight``: the largest weight (``num-examples``) a reply may carry."""

    privacy_kind = (
        "secagg"  # what fedsim/config/schema.py's wrapper_kind reads: privacy.kind=secagg
    )
    round_class: type[RoundRun]  # one round on the server (set below: RoundRun)

    def __init__(
        self,
        strategy: Strategy,
        degree: int | None = None,
        threshold: float = 0.5,
        clip_range: float = 4.0,
        max_weight: float = 10_000.0,
    ):
        if degree is not None and (degree < 2 or degree % 2):
            raise ValueError(f"degree must be an even number >= 2 or null, got {degree}")
        if not 0.5 <= threshold < 1:
            raise ValueError(f"threshold must be in [0.5, 1) (t above half), got {threshold}")
        if clip_range <= 0 or max_weight <= 0:
            raise ValueError("clip_range and max_weight must be > 0")
        self.strategy, self.degree, self.fraction = strategy, degree, float(threshold)
        self.clip, self.max_weight = float(clip_range), float(max_weight)
        self.weight_key = getattr(strategy, "weighted_by_key", NUM_EXAMPLES)
        self.rounds: dict[int, dict] = {}
        self.ahead: dict[int, tuple[bytes, bytes, bytes]] = {}  # node -> keys for its next round

    def summary(self) -> None:
        log.info(
            "SecAgg+ (degree %s, t > %.2f of a neighbourhood, clip %g) around:",
            self.degree or "all",
            self.fraction,
            self.clip,
        )
        self.strategy.summary()

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn=None,
    ) -> Result:
        """Flower's loop over a :class:`SecAggGrid` of ``grid``."""
        view = phase_grid(grid, "secagg", timeout)
        return super().start(
            SecAggGrid(view, self),
            initial_arrays,
            num_rounds,
            timeout,
            train_config,
            evaluate_config,
            evaluate_fn,
        )

    def secure_round(self, grid: PhaseGrid, messages: list[Message]) -> list[Message]:
        """One round's train exchange under SecAgg+: the unmasked mean as one reply."""
        rnd = int(messages[0].content[keys.CONFIG][keys.SERVER_ROUND])
        try:
            return [self.round_class(self, grid, rnd, messages).run()]
        except protocol.Unrecoverable as exc:
            raise PhaseFailed(f"{grid.label}/secagg round {rnd}: {exc}") from exc


class SecAggGrid(PhaseGrid):
    """A view whose train exchange is :meth:`SecAggPlus.secure_round`; the rest is the view's."""

    def __init__(self, view: PhaseGrid, secagg: SecAggPlus):
        super().__init__(view.messenger, view.label, view.policy, view._nodes, view._checks)
        self.secagg = secagg

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.message_type == MessageType.TRAIN:
            return self.secagg.secure_round(self, messages)
        return super().send_and_receive(messages, timeout=timeout)


def _content(base: dict, config: dict) -> RecordDict:
    return RecordDict({keys.CONFIG: ConfigRecord({**base, **config})})


def _to(node: int, content: RecordDict) -> Message:
    """A query of ``content`` to ``node`` (a stage that asks every node the same shares one
    content, as a strategy's train messages do: built and measured once)."""
    return Message(content, dst_node_id=node, message_type=MessageType.QUERY)


def _query(node: int, base: dict, config: dict) -> Message:
    return _to(node, _content(base, config))


class MaskedVector:
    """A mask reply's ArrayRecord; its one array is checked and decoded once, by the mask
    stage's reply check (``Arrays()`` would decode it, and the server again)."""

    kind = ArrayRecord

    def problem(self, record, node: int) -> str | None:
        return None


class RoundRun:
    """One SecAgg+ round on the server: what it learned so far, stage by stage."""

    def __init__(self, secagg: SecAggPlus, grid: PhaseGrid, rnd: int, messages: list[Message]):
        self.s, self.grid, self.rnd = secagg, grid, rnd
        self.train = {m.metadata.dst_node_id: m for m in messages}
        self.base = {
            k: v for k, v in messages[0].content[keys.CONFIG].items() if k != keys.SERVER_ROUND
        }
        self.sent = from_record(messages[0].content[ARRAYS])
        self.size = 1 + sum(a.size for a in self.sent.values())
        self.book: dict[int, protocol.Advertised] = {}

    def _exchange(self, phase: str, messages: list[Message], check) -> list[Message]:
        return self.grid.exchange(phase, messages, Policy(ANY, check), self.rnd)

    def run(self) -> Message:
        self._advertise()
        nodes = sorted(self.book)
        seed = protocol.GRAPH.seed(int(self.base.get(SEED_KEY, 0)), round=self.rnd)
        self.graph = protocol.neighbours(nodes, self.s.degree, seed)
        self.t = {n: protocol.threshold(self.s.fraction, len(self.graph[n])) for n in nodes}
        tokens = self._share()
        masked, masked_with, replies = self._mask(tokens)
        live, dropped = self._live(masked_with)
        signatures = self._check(live)
        unmasker = protocol.Unmasker(self.book, self.t)
        shares = self._unmask(unmasker, live, dropped, signatures)
        seeds, mask_keys = unmasker.secrets(shares, live, dropped)
        total = unmasker.total(
            {n: masked[n] for n in live}, {n: masked_with[n] for n in live}, seeds, mask_keys
        )
        return self._aggregate_reply(total, [replies[n] for n in live], len(dropped))

    def _advertise(self) -> None:
        """Step 1 for the sampled nodes whose keys the server does not hold from their last unmask
        reply (:attr:`SecAggPlus.ahead`, each trio used for one round). A node whose key is
        another's is left out with it (``duplicate``): honest neighbours refuse a neighbourhood
        with a key twice (``protocol.share``), which would stop the round."""
        ahead = {n: self.s.ahead.pop(n) for n in self.train if n in self.s.ahead}
        trios = ahead | self._fresh_keys([n for n in self.train if n not in ahead])
        seen = Counter(key for trio in trios.values() for key in trio)
        clashing = {n for n, trio in trios.items() if any(seen[k] > 1 for k in trio)}
        if clashing:
            self.grid.messenger.count(
                f"{self.grid.label}/secagg-keys", self.rnd, duplicate=len(clashing)
            )
        self.book = {n: protocol.Advertised(trio) for n, trio in trios.items() if n not in clashing}

    def _fresh_keys(self, nodes: list[int]) -> dict[int, tuple[bytes, bytes, bytes]]:
        """Step 1's exchange with ``nodes``: the public keys each made for this round."""
        if not nodes:
            return {}
        schema = Reply(
            {
                keys.CONFIG: Config(
                    {
                        keys.ROUND: Number(self.rnd, self.rnd, whole=True),
                        **{k: Blob(KEY_BYTES) for k in keys.KEY_TRIO},
                    }
                )
            },
            check=_keys_problem,
        )
        asks = [
            _query(n, self.base, {keys.OP: keys.ADVERTISE, keys.ROUND: self.rnd, keys.SELF: n})
            for n in nodes
        ]
        replies = self.grid.exchange(
            "secagg-keys", asks, Policy(ANY, schema, claim=_key_trio), self.rnd
        )
        return {m.metadata.src_node_id: _key_trio(m.content) for m in replies}

    def _share(self) -> dict[tuple[int, int], bytes]:
        """Step 2; the ciphertexts by (source, destination)."""

        unpacked: dict[int, tuple] = {}  # a reply's lists, unpacked once by its check

        def check(content: RecordDict, node: int) -> str | None:
            record, hood = content[keys.CONFIG], self.graph[node]
            others = [n for n in hood if n != node]
            try:
                dsts = wire.unpack_ids(record[keys.DESTINATIONS])
                tokens = wire.unpack_blobs(record[keys.CIPHERTEXTS], TOKEN_BYTES)
                seed_hashes = wire.unpack_blobs(record[keys.SEED_HASHES], 32)
                key_hashes = wire.unpack_blobs(record[keys.KEY_HASHES], 32)
            except ValueError as exc:
                return f"its packed lists do not unpack: {exc}"
            if dsts != others:
                return "its ciphertexts are not for its neighbours, one each, in order"
            if len(tokens) != len(others):
                return "one ciphertext per neighbour expected"
            hashes = seed_hashes + key_hashes
            if len(hashes) != 2 * len(hood) or any(len(h) != 32 for h in hashes):
                return "a SHA-256 of each share expected"
            if len(record[keys.SEED_COMMITMENT]) != 32:
                return "no seed commitment"
            unpacked[node] = (dsts, tokens, seed_hashes, key_hashes)
            return None

        most = max(len(hood) for hood in self.graph.values())
        schema = Reply(
            {
                keys.CONFIG: Config(
                    {
                        keys.ROUND: Number(self.rnd, self.rnd, whole=True),
                        keys.DESTINATIONS: ids_of(most),
                        keys.CIPHERTEXTS: blobs_of(most, TOKEN_BYTES),
                        keys.SEED_HASHES: blobs_of(most, 32),
                        keys.KEY_HASHES: blobs_of(most, 32),
                        keys.SEED_COMMITMENT: Blob(32),
                    }
                )
            },
            check=check,
        )
        messages, packed = [], {}
        for node in self.book:
            hood = tuple(self.graph[node])
            if hood not in packed:  # SecAgg: one neighbourhood, every node's
                packed[hood] = {
                    keys.IDS: wire.ids(hood),
                    **{
                        name: wire.blobs(self.book[n].keys[i] for n in hood)
                        for i, name in enumerate(keys.KEY_TRIO)
                    },
                }
            messages.append(
                _query(
                    node,
                    self.base,
                    {
                        keys.OP: keys.SHARE,
                        keys.ROUND: self.rnd,
                        keys.THRESHOLD: self.t[node],
                        **packed[hood],
                    },
                )
            )
        tokens = {}
        shared = self._exchange("secagg-share", messages, schema)
        for reply in shared:
            node, record = reply.metadata.src_node_id, reply.content[keys.CONFIG]
            dsts, sent, seed_hashes, key_hashes = unpacked[node]
            entry = self.book[node]
            entry.seed_hashes = dict(zip(self.graph[node], seed_hashes))
            entry.key_hashes = dict(zip(self.graph[node], key_hashes))
            entry.seed_commitment = record[keys.SEED_COMMITMENT]
            for dst, token in zip(dsts, sent):
                tokens[(node, dst)] = token
        self.shared = sorted(m.metadata.src_node_id for m in shared)
        return tokens

    def _mask(self, tokens):
        """Step 3: the strategy's train messages to the nodes that shared, each with the
        ciphertexts its neighbours sent it; their masked vectors, whom each masked with, and
        their replies."""
        self.levels = protocol.levels(len(self.shared))
        sources = {
            n: [m for m in self.graph[n] if m != n and (m, n) in tokens] for n in self.shared
        }
        messages = []
        for node in self.shared:
            msg = self.train[node]
            msg.content = RecordDict(  # a strategy's messages may share one content
                {
                    **{name: msg.content[name] for name in msg.content.keys()},
                    keys.CONFIG: ConfigRecord(
                        {
                            **msg.content[keys.CONFIG],
                            keys.OP: keys.MASK,
                            keys.ROUND: self.rnd,
                            keys.SOURCES: wire.ids(sources[node]),
                            keys.CIPHERTEXTS: wire.blobs(tokens[(m, node)] for m in sources[node]),
                            **self.mask_config(),
                        }
                    ),
                }
            )
            messages.append(msg)

        vectors: dict[int, np.ndarray] = {}  # decoded once, by the check
        kept: dict[int, list[int]] = {}

        def check(content: RecordDict, node: int) -> str | None:
            record = content[keys.MASKED]
            if list(record) != [keys.VECTOR]:
                return f"one array {keys.VECTOR!r} expected"
            vector = record[keys.VECTOR]
            if str(vector.dtype) != "uint32" or list(vector.shape) != [self.size]:
                return f"a uint32 vector of {self.size} values expected"
            try:
                with_nodes = wire.unpack_ids(content[keys.CONFIG][keys.MASKED_WITH])
            except ValueError as exc:
                return f"{keys.MASKED_WITH}: {exc}"
            if not set(with_nodes) <= set(sources[node]):
                return "it claims masks with nodes that sent it no shares"
            values = decoded(keys.VECTOR, vector)  # undecodable, or not what it declares
            if isinstance(values, str):
                return values
            vectors[node], kept[node] = values, with_nodes
            return None

        schema = Reply(
            {
                keys.MASKED: MaskedVector(),
                keys.METRICS: Metrics({self.s.weight_key: Number(0, self.s.max_weight)}),
                keys.CONFIG: Config(
                    {
                        keys.ROUND: Number(self.rnd, self.rnd, whole=True),
                        keys.MASKED_WITH: ids_of(len(self.graph)),
                    }
                ),
            },
            check=check,
        )
        replies = self._exchange("train", messages, schema)
        masked = {m.metadata.src_node_id: vectors[m.metadata.src_node_id] for m in replies}
        masked_with = {m.metadata.src_node_id: kept[m.metadata.src_node_id] for m in replies}
        self.sources = sources
        return masked, masked_with, {m.metadata.src_node_id: m for m in replies}

    def mask_config(self) -> dict:
        """What the mask stage tells every client about encoding its update (after
        :attr:`levels` is set): the clip, the levels, the weight's scale and key."""
        return {
            keys.CLIP: self.s.clip,
            keys.LEVELS: self.levels,
            keys.MAX_WEIGHT: self.s.max_weight,
            keys.WEIGHT_KEY: self.s.weight_key,
        }

    def _live(self, masked_with: dict[int, list[int]]) -> tuple[list[int], list[int]]:
        """The nodes whose inputs are summed: those that sent one, less any whose share a live
        neighbour could not use (that neighbour left its pairwise mask out; counted malformed
        in ``<label>/secagg-share``). The rest of those that shared are dropped."""
        accused = {
            src for node, kept in masked_with.items() for src in set(self.sources[node]) - set(kept)
        }
        if accused:
            log.warning(
                "secagg round %d: nodes %s sent shares a neighbour could not use; left out",
                self.rnd,
                sorted(accused),
            )
            self.grid.messenger.count(
                f"{self.grid.label}/secagg-share", self.rnd, malformed=len(accused)
            )
        live = sorted(set(masked_with) - accused)
        if not live:
            raise protocol.Unrecoverable("no node's masked input is left to sum")
        return live, sorted(set(self.shared) - set(live))

    def _check(self, live: list[int]) -> dict[int, bytes]:
        message = protocol.check_message(self.rnd, live)

        def check(content: RecordDict, node: int) -> str | None:
            signature = content[keys.CONFIG][keys.SIGNATURES]
            public = bytes_to_public_key(self.book[node].keys[2])
            return None if verify_signature(public, message, signature) else "a bad signature"

        schema = Reply(
            {
                keys.CONFIG: Config(
                    {
                        keys.ROUND: Number(self.rnd, self.rnd, whole=True),
                        keys.SIGNATURES: Blob(256),
                    }
                )
            },
            check=check,
        )
        content = _content(
            self.base, {keys.OP: keys.CHECK, keys.ROUND: self.rnd, keys.LIVE: wire.ids(live)}
        )
        signed = self._exchange("secagg-check", [_to(n, content) for n in live], schema)
        return {m.metadata.src_node_id: m.content[keys.CONFIG][keys.SIGNATURES] for m in signed}

    def _unmask(
        self, unmasker, live, dropped, signatures
    ) -> dict[int, tuple[list[int], list[bytes]]]:
        unpacked: dict[int, tuple[list[int], list[bytes]]] = {}
        live_set, dropped_set = set(live), set(dropped)

        def check(content: RecordDict, node: int) -> str | None:
            record = content[keys.CONFIG]
            try:
                ids = wire.unpack_ids(record[keys.IDS])
                shares = wire.unpack_blobs(record[keys.SHARES], TOKEN_BYTES)
            except ValueError as exc:
                return f"its packed lists do not unpack: {exc}"
            if len(ids) != len(shares):
                return "one share per id expected"
            if why := unmasker.problem(node, ids, shares, live_set, dropped_set):
                return why
            if why := _keys_problem(content, node):
                return f"its keys for the next round: {why}"
            unpacked[node] = ids, shares
            return None

        most = len(self.graph)
        schema = Reply(
            {
                keys.CONFIG: Config(
                    {
                        keys.ROUND: Number(self.rnd, self.rnd, whole=True),
                        keys.IDS: ids_of(most),
                        keys.SHARES: blobs_of(most, TOKEN_BYTES),
                        **{k: Blob(KEY_BYTES) for k in keys.KEY_TRIO},
                    }
                )
            },
            check=check,
        )
        signers = sorted(signatures)
        content = _content(
            self.base,
            {
                keys.OP: keys.UNMASK,
                keys.ROUND: self.rnd,
                keys.LIVE: wire.ids(live),
                keys.DROPPED: wire.ids(dropped),
                keys.IDS: wire.ids(signers),
                keys.SIGNATURES: wire.blobs(signatures[n] for n in signers),
            },
        )
        replies = self._exchange("secagg-unmask", [_to(n, content) for n in signers], schema)
        self.s.ahead.update({m.metadata.src_node_id: _key_trio(m.content) for m in replies})
        return {m.metadata.src_node_id: unpacked[m.metadata.src_node_id] for m in replies}

    def _aggregate_reply(self, total: np.ndarray, replies: list[Message], dropped: int) -> Message:
        """The strategy's one reply: the mean, weighing the live replies' weights together, their
        metrics aggregated as FedAvg does, the round's SecAgg figures."""
        values, weight = protocol.decode(total, len(replies), self.s.clip, self.levels)
        if weight <= 0:
            raise protocol.Unrecoverable("the live clients' weights sum to 0")
        reported = sum(float(m.content[keys.METRICS][self.s.weight_key]) for m in replies)
        # each weight is rounded to a level (half a level off at most): more is a client's lie
        if (
            abs(weight * self.s.max_weight - reported)
            > len(replies) * self.s.max_weight / self.levels
        ):
            raise protocol.Unrecoverable(
                f"the masked weights sum to {weight * self.s.max_weight:.6g}, the replies "
                f"reported {reported:.6g}: a live client masked a weight it did not report"
            )
        mean = unflatten(values / weight, self.sent)
        metrics = {
            k: float(v)
            for k, v in aggregate_metricrecords(
                [m.content for m in replies], self.s.weight_key
            ).items()
            if isinstance(v, (int, float))
        }
        figures = {
            self.s.weight_key: reported,
            "secagg-live": len(replies),
            "secagg-dropped": dropped,
            "secagg-error-bound": protocol.error_bound(len(replies), self.s.clip, self.levels)
            / weight,
        }
        self.s.rounds[self.rnd] = dict(figures)
        out = replies[0]
        out.content = RecordDict(
            {ARRAYS: to_record(dict(mean)), keys.METRICS: MetricRecord({**metrics, **figures})}
        )
        return out


SecAggPlus.round_class = RoundRun


def _keys_problem(content: RecordDict, node: int) -> str | None:
    """Why a reply's three public keys are unusable (None: each a PEM EC public key)."""
    try:
        for name in keys.KEY_TRIO:
            bytes_to_public_key(content[keys.CONFIG][name])
    except Exception:  # noqa: BLE001 - anything that is not a PEM EC public key
        return "a public key that does not parse"
    return None


def _key_trio(content: RecordDict) -> tuple[bytes, bytes, bytes]:
    record = content[keys.CONFIG]
    return tuple(record[k] for k in keys.KEY_TRIO)
