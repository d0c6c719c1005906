"""CKKS-encrypted FedAvg as a wrapper around any weight-averaging Flower strategy.

The wrapped strategy picks the nodes and the train config (``configure_train``) and names the
weighting metric (``weighted_by_key``, FedAvg's ``num-examples``); this wrapper replaces its
plaintext averaging. A round:

1. train: sampled nodes train from their own copy of the global model and keep the result;
   they reply with metrics, the weight count and the public CKKS context (no arrays);
2. for each chunk of ``chunk_floats`` values: the accepted nodes send that chunk encrypted;
   the server computes sum_i (n_i / sum n) * ct_i on ciphertexts and sends the aggregate chunk
   to every node, which decrypts it into its copy of the global model.

The server holds at most one chunk per client plus one aggregate at any time (memory bounded
for a full model) and never a secret key or a plaintext update. A node that fails during the
chunk phase is left out of that chunk's weights (the chunk stays a weighted mean of the nodes
that sent it) and counted. Client side: ``clients/he_client.py``.
"""

from __future__ import annotations

import logging
import math
import time

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedsim import he
from fedsim.he import blobs_record, record_blobs

log = logging.getLogger("fedsim")

OP_KEY = "he-op"  # client-side dispatch of QUERY messages: "encrypt" | "install"


class HEFedAvg(Strategy):
    """``strategy``'s sampling and weighting, CKKS-encrypted averaging (TenSEAL)."""

    def __init__(self, strategy: Strategy, chunk_floats: int = 262_144, slots: int = 4096):
        self.strategy = strategy
        self.weight_key = getattr(strategy, "weighted_by_key", "num-examples")
        self.chunk_floats = int(math.ceil(chunk_floats / slots) * slots)
        self.slots = slots
        self.context = None  # the public context, built from client bytes
        self.key_id = None
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

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config=None, evaluate_fn=None) -> Result:
        """Rounds of encrypted FedAvg. The initial model is the clients' (their common
        starting weights); ``Result.arrays`` is empty: only clients hold the global model."""
        result = Result()
        base = dict(train_config or {})
        for rnd in range(1, num_rounds + 1):
            start = time.perf_counter()
            metrics = self._round(grid, rnd, base, timeout)
            metrics["round-seconds"] = time.perf_counter() - start
            self.rounds[rnd] = dict(metrics)
            result.train_metrics_clientapp[rnd] = MetricRecord(metrics)
            log.info("[he] round %d/%d: %.1f s, %.2f MB up per client", rnd, num_rounds,
                     metrics["round-seconds"], metrics["bytes-up-per-client"] / 1e6)
        return result

    def _round(self, grid: Grid, rnd: int, base: dict, timeout: float) -> dict:
        messages = list(self.strategy.configure_train(
            rnd, ArrayRecord(), ConfigRecord({**base, "he": True}), grid))
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        accepted = self._accept_train(rnd, replies)
        if not accepted:
            raise RuntimeError(f"HE round {rnd}: no usable train reply "
                               f"({len(messages)} sent, {len(replies)} replied)")
        weights = {m.metadata.src_node_id: float(m.content["metrics"][self.weight_key])
                   for m in accepted}
        sizes = {int(m.content["metrics"]["num-floats"]) for m in accepted}
        if len(sizes) != 1:
            raise RuntimeError(f"HE round {rnd}: clients disagree on the model size {sizes}")
        num_floats = sizes.pop()
        num_chunks = math.ceil(num_floats / self.chunk_floats)
        stats = {"sent": len(messages), "accepted": len(accepted), "chunk-failures": 0,
                 "bytes-up": 0, "bytes-down": 0, "encrypt-seconds": 0.0,
                 "aggregate-seconds": 0.0, "decrypt-seconds": 0.0}
        everyone = list(grid.get_node_ids())
        for chunk in range(num_chunks):
            blobs = self._collect(grid, rnd, chunk, weights, base, timeout, stats)
            t = time.perf_counter()
            senders = list(blobs)
            total = sum(weights[n] for n in senders)
            aggregate = he.weighted_sum(self.context, [blobs[n] for n in senders],
                                        [weights[n] / total for n in senders])
            stats["aggregate-seconds"] += time.perf_counter() - t
            del blobs
            self._install(grid, rnd, chunk, num_chunks, num_floats, aggregate, everyone, base,
                          timeout, stats)
        train_metrics = aggregate_metricrecords([m.content for m in accepted], self.weight_key)
        out = {k: float(v) for k, v in train_metrics.items() if isinstance(v, (int, float))}
        n_acc = len(accepted)
        out.update({"replies-sent": stats["sent"], "replies-accepted": n_acc,
                    "chunks": num_chunks, "chunk-failures": stats["chunk-failures"],
                    "bytes-up-per-client": stats["bytes-up"] / n_acc,
                    "bytes-down-per-client": stats["bytes-down"] / len(everyone),
                    "encrypt-seconds-per-client": stats["encrypt-seconds"] / n_acc,
                    "aggregate-seconds": stats["aggregate-seconds"],
                    "decrypt-seconds-per-client": stats["decrypt-seconds"] / len(everyone)})
        return out

    def _accept_train(self, rnd: int, replies: list[Message]) -> list[Message]:
        good = []
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                log.warning("[he] round %d: node %s failed: %s", rnd, node, msg.error.reason)
                continue
            content = msg.content
            if "metrics" not in content.metric_records or "he" not in content.config_records:
                log.warning("[he] round %d: node %s sent no HE train reply; left out", rnd, node)
                continue
            public = content["he"]["public-context"]
            if self.context is None:
                self.context = he.server_context(public)
                self.key_id = he.key_id(public)
            elif he.key_id(public) != self.key_id:
                log.warning("[he] round %d: node %s uses another key; left out", rnd, node)
                continue
            good.append(msg)
        return good

    def _query(self, grid: Grid, nodes: list[int], content: dict, record: ArrayRecord | None,
               timeout: float, label: str) -> list[Message]:
        out = []
        for node in nodes:
            rd = RecordDict({"config": ConfigRecord(content)})
            if record is not None:
                rd["ciphertexts"] = record
            out.append(Message(rd, dst_node_id=node, message_type=MessageType.QUERY))
        replies = [m for m in grid.send_and_receive(out, timeout=timeout) if not m.has_error()]
        if len(replies) < len(nodes):
            log.warning("[he] %s: %d of %d nodes failed or timed out", label,
                        len(nodes) - len(replies), len(nodes))
        return replies

    def _collect(self, grid, rnd, chunk, weights, base, timeout, stats) -> dict[int, list]:
        config = {**base, OP_KEY: "encrypt", "server-round": rnd, "chunk": chunk,
                  "chunk-floats": self.chunk_floats}
        replies = self._query(grid, list(weights), config, None, timeout,
                              f"round {rnd} chunk {chunk} encrypt")
        blobs = {}
        for msg in replies:
            try:
                blobs[msg.metadata.src_node_id] = record_blobs(msg.content["ciphertexts"])
            except (KeyError, ValueError) as exc:
                log.warning("[he] round %d chunk %d: node %s sent no ciphertexts (%s)", rnd,
                            chunk, msg.metadata.src_node_id, exc)
                continue
            stats["bytes-up"] += sum(len(b) for b in blobs[msg.metadata.src_node_id])
            stats["encrypt-seconds"] += float(msg.content["metrics"]["encrypt-seconds"])
        stats["chunk-failures"] += len(weights) - len(blobs)
        if not blobs:
            raise RuntimeError(f"HE round {rnd} chunk {chunk}: no client sent ciphertexts")
        return blobs

    def _install(self, grid, rnd, chunk, num_chunks, num_floats, aggregate, nodes, base,
                 timeout, stats) -> None:
        config = {**base, OP_KEY: "install", "server-round": rnd, "chunk": chunk,
                  "num-chunks": num_chunks, "chunk-floats": self.chunk_floats,
                  "num-floats": num_floats}
        replies = self._query(grid, nodes, config, blobs_record(aggregate), timeout,
                              f"round {rnd} chunk {chunk} install")
        stats["bytes-down"] += sum(len(b) for b in aggregate) * len(nodes)
        stats["decrypt-seconds"] += sum(float(m.content["metrics"]["decrypt-seconds"])
                                        for m in replies)
