"""CKKS-encrypted FedAvg as a wrapper around any weight-averaging Flower strategy.

The wrapped strategy picks the nodes and the train config (``configure_train``) and names the
weighting metric (``weighted_by_key``, FedAvg's ``num-examples``); this wrapper replaces its
plaintext averaging. A round, each step a phase of the one messaging path
(``fedsim.runtime.messaging``, faults and bytes counted per phase and round):

1. ``<label>/train`` (quorum: any): sampled nodes train from their complete copy of the last
   round's aggregate (round 1: the clients' common initial model) and keep the result; they
   reply with metrics, the weight count and the public CKKS context (no arrays);
2. per chunk of ``chunk_floats`` values, ``<label>/he-encrypt`` (quorum: any): the accepted
   nodes send that chunk encrypted; the server computes sum_i (n_i / sum n) * ct_i on
   ciphertexts; ``<label>/he-install`` (quorum: any): every node decrypts the aggregate chunk
   into its copy, which becomes its global model only when all chunks of the round are in.

**One trip** (``one_trip``, default): when an update fits in one chunk (LoRA adapters: a few MB
encrypted), step 2 folds into step 1: the train reply carries the update encrypted, the server
sums the ciphertexts, and the encrypted aggregate rides with the next round's train messages
(each sampled node installs it, then trains from it); after the last round one
``<label>/he-install`` gives it to every node. A round is then one exchange, as in plaintext
FedAvg. Larger updates (full models) take the chunk path above.

The server holds at most one chunk per client plus one aggregate at any time (memory bounded
for a full model) and never a secret key or a plaintext update. A node that fails during the
chunk phase is left out of that chunk's weights (the chunk stays a weighted mean of the nodes
that sent it) and counted; a node that misses an install holds no complete copy of that round
and refuses to train or evaluate from it. Client half: ``fedsim/privacy/he/client.py``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedsim.flower.strategies import aggregate_metricrecords
from fedsim.message_keys import NUM_EXAMPLES
from fedsim.privacy.he import ckks
from fedsim.privacy.he import messages as keys
from fedsim.runtime.messaging import ANY, PhaseGrid, Policy, phase_grid
from fedsim.runtime.validators import Arrays, Blob, Config, Metrics, Number, Reply, Text

log = logging.getLogger("fedsim")


class HEFedAvg(Strategy):
    """``strategy``'s sampling and weighting, CKKS-encrypted averaging (TenSEAL), under the
    clients' CKKS parameters (the task's ``he``): what a client sends is held to their sizes."""

    privacy_kind = "he"  # what fedsim/config/schema.py's wrapper_kind reads: privacy.kind=he

    def __init__(
        self,
        strategy: Strategy,
        chunk_floats: int = 262_144,
        one_trip: bool = True,
        poly_modulus_degree: int = ckks.CKKSParams.poly_modulus_degree,
        coeff_mod_bit_sizes: Sequence[int] = ckks.CKKSParams.coeff_mod_bit_sizes,
    ):
        self.strategy = strategy
        self.one_trip = one_trip
        self.carry = None  # one trip: (round, encrypted aggregate, floats) for the next messages
        self.weight_key = getattr(strategy, "weighted_by_key", NUM_EXAMPLES)
        self.params = ckks.CKKSParams(int(poly_modulus_degree), tuple(coeff_mod_bit_sizes))
        self.slots = self.params.slots
        self.chunk_floats = int(math.ceil(chunk_floats / self.slots) * self.slots)
        self.context = None  # the public context, built from client bytes
        self.probe = None  # ciphertexts a client sends must add to encryptions under it
        self._probes: dict[
            str, ckks.Probe
        ] = {}  # key id -> probe, until the federation's key is known
        self.key_id = None
        self.num_floats = None  # the model's size, fixed with the key by the first round's majority
        self.rounds: dict[int, dict] = {}

    def summary(self) -> None:
        log.info("HEFedAvg (CKKS, chunks of %d floats) around:", self.chunk_floats)
        self.strategy.summary()

    # The wrapped strategy's message-level hooks stay available for callers that drive rounds.
    def configure_train(self, server_round, arrays, config, grid):
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        raise NotImplementedError("HEFedAvg aggregates in start(): the sum needs the grid")

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []

    def aggregate_evaluate(self, server_round, replies):
        return None

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config=None,
        evaluate_fn=None,
    ) -> Result:
        """Rounds of encrypted FedAvg. The initial model is the clients' (their common
        starting weights); ``Result.arrays`` is empty: only clients hold the global model."""
        view = phase_grid(grid, "he", timeout)
        result = Result()
        base = dict(train_config or {})
        for rnd in range(1, num_rounds + 1):
            start = time.perf_counter()
            metrics = self._round(view, rnd, base)
            metrics["round-seconds"] = time.perf_counter() - start
            self.rounds[rnd] = dict(metrics)
            result.train_metrics_clientapp[rnd] = MetricRecord(metrics)
            log.info(
                "[he] round %d/%d: %.1f s, %.2f MB up per client",
                rnd,
                num_rounds,
                metrics["round-seconds"],
                metrics["bytes-up-per-client"] / 1e6,
            )
        if self.carry is not None:  # the last aggregate goes to every node
            rnd, aggregate, num_floats = self.carry
            nodes = list(view.get_node_ids())
            seconds = self._install(view, rnd, 0, 1, num_floats, aggregate, nodes, base)
            self.rounds[rnd]["decrypt-seconds-per-client"] = seconds / len(
                nodes
            )  # the last round's
            self.carry = None
        return result

    def _train_messages(self, grid: PhaseGrid, rnd: int, base: dict) -> list[Message]:
        """The wrapped strategy's train messages; in one-trip mode with the last aggregate."""
        config = {
            **base,
            keys.HE_ROUND: True,
            keys.GLOBAL_ROUND: rnd - 1,
            keys.INLINE_FLOATS: self.chunk_floats if self.one_trip else 0,
        }
        if self.carry is not None:
            config |= {
                keys.INSTALL_ROUND: self.carry[0],
                keys.NUM_FLOATS: self.carry[2],
                keys.KEY_ID: self.key_id,
            }
        messages = list(
            self.strategy.configure_train(rnd, ArrayRecord(), ConfigRecord(config), grid)
        )
        if self.carry is not None:
            record = ckks.blobs_record(self.carry[1])
            for msg in messages:
                msg.content[keys.CIPHERTEXTS] = record
        return messages

    def _round(self, grid: PhaseGrid, rnd: int, base: dict) -> dict:
        accepted = grid.exchange(
            "train",
            self._train_messages(grid, rnd, base),
            Policy(ANY, self._train_problem, agree=self._setting),
            rnd,
        )
        self._adopt(accepted)
        self.carry = None
        weights = {
            m.metadata.src_node_id: float(m.content[keys.METRICS][self.weight_key])
            for m in accepted
        }
        num_floats = self.num_floats  # every accepted reply has this size (_train_problem)
        if all(keys.CIPHERTEXTS in m.content.array_records for m in accepted):
            return self._one_trip_round(grid, rnd, accepted, weights, num_floats)
        num_chunks = math.ceil(num_floats / self.chunk_floats)
        everyone = list(grid.get_node_ids())
        seconds = {"aggregate": 0.0, "encrypt": 0.0, "decrypt": 0.0}
        chunk_failures = 0
        for chunk in range(num_chunks):
            blobs, seconds["encrypt"] = self._collect(
                grid, rnd, chunk, num_floats, weights, base, seconds["encrypt"]
            )
            chunk_failures += len(weights) - len(blobs)
            t = time.perf_counter()
            total = sum(weights[n] for n in blobs)
            aggregate = ckks.weighted_sum(
                self.context, list(blobs.values()), [weights[n] / total for n in blobs]
            )
            seconds["aggregate"] += time.perf_counter() - t
            del blobs
            seconds["decrypt"] += self._install(
                grid, rnd, chunk, num_chunks, num_floats, aggregate, everyone, base
            )
        return self._round_metrics(
            grid, rnd, accepted, everyone, num_chunks, chunk_failures, seconds
        )

    def _one_trip_round(
        self, grid: PhaseGrid, rnd: int, accepted: list[Message], weights: dict, num_floats: int
    ) -> dict:
        """Sum the ciphertexts the train replies carry; keep the aggregate for the next messages."""
        start = time.perf_counter()
        total = sum(weights.values())
        aggregate = ckks.weighted_sum(
            self.context,
            [ckks.record_blobs(m.content[keys.CIPHERTEXTS]) for m in accepted],
            [weights[m.metadata.src_node_id] / total for m in accepted],
        )
        self.carry = (rnd, aggregate, num_floats)
        out = self._train_metrics(accepted)
        traffic = grid.messenger.round_traffic(f"{grid.label}/train", rnd)
        n_acc = len(accepted)
        out.update(
            {
                "clients": n_acc,
                "chunks": 1,
                "chunk-failures": 0,
                "one-trip": 1,
                "bytes-up-per-client": traffic.get("bytes_up", 0) / n_acc,
                "bytes-down-per-client": traffic.get("bytes_down", 0) / traffic.get("messages", 1),
                "encrypt-seconds-per-client": out.get(keys.ENCRYPT_SECONDS, 0.0),
                "aggregate-seconds": time.perf_counter() - start,
                "decrypt-seconds-per-client": out.get(keys.DECRYPT_SECONDS, 0.0),
            }
        )
        return out

    def _train_metrics(self, accepted: list[Message]) -> dict:
        train = aggregate_metricrecords([m.content for m in accepted], self.weight_key)
        return {k: float(v) for k, v in train.items() if isinstance(v, (int, float))}

    def _round_metrics(
        self, grid, rnd, accepted, everyone, num_chunks, chunk_failures, seconds
    ) -> dict:
        out = self._train_metrics(accepted)
        enc = grid.messenger.round_traffic(f"{grid.label}/he-encrypt", rnd)
        inst = grid.messenger.round_traffic(f"{grid.label}/he-install", rnd)
        n_acc = len(accepted)
        out.update(
            {
                "clients": n_acc,
                "chunks": num_chunks,
                "chunk-failures": chunk_failures,
                "bytes-up-per-client": enc.get("bytes_up", 0) / n_acc,
                "bytes-down-per-client": inst.get("bytes_down", 0) / len(everyone),
                "encrypt-seconds-per-client": seconds["encrypt"] / n_acc,
                "aggregate-seconds": seconds["aggregate"],
                "decrypt-seconds-per-client": seconds["decrypt"] / len(everyone),
            }
        )
        return out

    def _train_problem(self, content: RecordDict, node: int) -> str | None:
        """Why an HE train reply is unusable (None if usable): it must be :meth:`_train_reply`,
        under the federation's key and for a model of the federation's size once they are known,
        carrying its update inline exactly when the message asked (one trip, an update that fits:
        a reply without it would send every node to the chunk phase, for an update none kept),
        its ciphertexts summable under its own public context."""
        if why := self._train_reply(content, node):
            return why
        public, floats = (
            content[keys.CONTEXT][keys.PUBLIC_CONTEXT],
            int(content[keys.METRICS][keys.NUM_FLOATS]),
        )
        key = ckks.key_id(public)
        if self.key_id is not None and key != self.key_id:
            return "encrypted under another key"
        if (
            self.num_floats is not None and floats != self.num_floats
        ):  # ciphertexts of two sizes cannot be summed
            return f"a model of {floats} floats; this federation's has {self.num_floats}"
        try:
            probe = self._probes.get(key) or self._probes.setdefault(
                key, ckks.Probe(ckks.server_context(public, self.params))
            )
        except ValueError as exc:
            return str(exc)
        inline = content.array_records.get(keys.CIPHERTEXTS)
        if (inline is not None) != (
            self.one_trip and floats <= self.chunk_floats
        ):  # as the message asked
            return f"the update {'' if inline is not None else 'not '}sent inline, against the round's mode"
        return None if inline is None else self._ciphertexts_problem(probe, inline, floats)

    def _setting(self, content: RecordDict) -> tuple[str, int]:
        """What the train replies must agree on: their key and their model's size. The first round's
        majority fixes both for the run (:meth:`_adopt`): no one reply does."""
        return ckks.key_id(content[keys.CONTEXT][keys.PUBLIC_CONTEXT]), int(
            content[keys.METRICS][keys.NUM_FLOATS]
        )

    def _adopt(self, accepted: list[Message]) -> None:
        """The federation's key and model size, those of the accepted replies (they agree)."""
        if self.key_id is None:
            self.key_id, self.num_floats = self._setting(accepted[0].content)
            self.probe = self._probes[self.key_id]
            self.context = self.probe.ctx
            self._probes = {self.key_id: self.probe}

    def _train_reply(self, content: RecordDict, node: int) -> str | None:
        """Its records: the public context, a positive weight and the model's size, ciphertexts
        where it carries its update (one trip)."""
        metrics = Metrics(
            {self.weight_key: Number(math.ulp(0.0)), keys.NUM_FLOATS: Number(1, whole=True)}
        )
        schema = Reply(
            {
                keys.CONTEXT: Config({keys.PUBLIC_CONTEXT: Blob()}),
                keys.METRICS: metrics,
                keys.CIPHERTEXTS: Arrays(),
            },
            optional=frozenset({keys.CIPHERTEXTS}),
        )
        return schema(content, node)

    def _ciphertexts_problem(
        self, probe: ckks.Probe, record: ArrayRecord, values: int
    ) -> str | None:
        """Why ``record`` does not hold ``values`` floats in ciphertexts this server can sum."""
        try:
            blobs = ckks.record_blobs(
                record, math.ceil(values / self.slots), self.params.ciphertext_bytes
            )
        except ckks.NotCiphertexts as exc:
            return str(exc)
        return probe.problem(blobs, values, self.slots)

    def _query(self, nodes: list[int], config: dict, record: ArrayRecord | None) -> list[Message]:
        out = []
        for node in nodes:
            content = RecordDict({keys.CONFIG: ConfigRecord(config)})
            if record is not None:
                content[keys.CIPHERTEXTS] = record
            out.append(Message(content, dst_node_id=node, message_type=MessageType.QUERY))
        return out

    def _collect(
        self, grid, rnd, chunk, num_floats, weights, base, seconds
    ) -> tuple[dict[int, list[bytes]], float]:
        """The chunk's ciphertexts by node, and ``seconds`` plus the clients' encrypt time."""
        config = {
            **base,
            keys.OP: keys.ENCRYPT,
            keys.SERVER_ROUND: rnd,
            keys.CHUNK: chunk,
            keys.CHUNK_FLOATS: self.chunk_floats,
            keys.KEY_ID: self.key_id,
        }
        values = min(self.chunk_floats, num_floats - chunk * self.chunk_floats)
        schema = Reply(
            {
                keys.CIPHERTEXTS: Arrays(),
                keys.CONTEXT: Config({keys.KEY_ID: Text()}),
                keys.METRICS: Metrics({keys.ENCRYPT_SECONDS: Number(0.0)}),
            }
        )

        def problem(content: RecordDict, node: int) -> str | None:
            if why := schema(content, node):
                return why
            if content[keys.CONTEXT][keys.KEY_ID] != self.key_id:
                return "encrypted under another key"
            return self._ciphertexts_problem(self.probe, content[keys.CIPHERTEXTS], values)

        replies = grid.exchange(
            "he-encrypt", self._query(list(weights), config, None), Policy(ANY, problem), rnd
        )
        return (
            {
                m.metadata.src_node_id: ckks.record_blobs(m.content[keys.CIPHERTEXTS])
                for m in replies
            },
            seconds + _seconds(replies, keys.ENCRYPT_SECONDS),
        )

    def _install(self, grid, rnd, chunk, num_chunks, num_floats, aggregate, nodes, base) -> float:
        """Send the aggregate chunk to every node; the clients' decrypt seconds."""
        config = {
            **base,
            keys.OP: keys.INSTALL,
            keys.SERVER_ROUND: rnd,
            keys.CHUNK: chunk,
            keys.NUM_CHUNKS: num_chunks,
            keys.CHUNK_FLOATS: self.chunk_floats,
            keys.NUM_FLOATS: num_floats,
            keys.KEY_ID: self.key_id,
        }
        replies = grid.exchange(
            "he-install",
            self._query(nodes, config, ckks.blobs_record(aggregate)),
            Policy(ANY, INSTALL_REPLY),
            rnd,
        )
        return _seconds(replies, keys.DECRYPT_SECONDS)


INSTALL_REPLY = Reply({keys.METRICS: Metrics({keys.DECRYPT_SECONDS: Number(0.0)})})


def _seconds(replies: list[Message], key: str) -> float:
    return sum(
        float(m.content[keys.METRICS].get(key, 0.0))
        for m in replies
        if keys.METRICS in m.content.metric_records
    )
