"""SecAgg+ as a layer around any client handler that exchanges weights, as the HE layer is
(``fedsim/runtime/he_layer.py``): the handler never sees a SecAgg message and its update never
leaves the node unmasked.

A message whose config names a SecAgg stage (``secagg-op``) is this layer's: the key, share,
check and unmask stages it answers itself (``fedsim/privacy/secagg/protocol.py``); a mask stage
is the strategy's train message, which the handler trains on, and whose reply the layer turns
into the masked, quantized update (its metrics stay plaintext); under distributed DP
(``privacy=secagg_ddp``: the mask config names the noise) into its rows as integers plus this
node's Skellam noise share (``fedsim/privacy/secagg/ddp.py``), masked. Every other message goes to the
handler untouched. The node's round state (its private keys, seed and the shares it holds) is
kept in its client-state folder between stages (``fedsim/runtime/client_state.py``): in a
simulation another process may serve the next stage; it never leaves the node. The server half:
``fedsim_strategies/secagg.py``.
"""

from __future__ import annotations

import fcntl
import json
import secrets

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedsim.message_keys import ARRAYS
from fedsim.privacy.secagg import ddp, protocol, wire
from fedsim.privacy.secagg import messages as keys
from fedsim.runtime import client_state
from fedsim.runtime.he_layer import flatten
from fedsim.runtime.records import from_record

STATE_FILE = "secagg-round.json"
LOCK_FILE = ".secagg-round.lock"


class SecAggLayer:
    """``handler``'s messages through this node's SecAgg+ state."""

    def __init__(self, handler, partition_id: int):
        self.handler, self.partition_id = handler, partition_id

    @staticmethod
    def passes(msg: Message) -> bool:
        """Whether the message is the handler's own: no SecAgg+ stage asked."""
        return msg.content[keys.CONFIG].get(keys.OP) is None

    def handle(self, msg: Message) -> RecordDict:
        if self.passes(msg):
            return self.handler.handle(msg)
        op = msg.content[keys.CONFIG][keys.OP]
        folder = client_state.of(msg, self.partition_id).folder
        # one stage of a node at a time: Flower may serve a node's messages in parallel, and two
        # requests that both read the round at one stage (two masks: one pad on two updates)
        # would each be answered
        with open(folder / LOCK_FILE, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._serve(op, folder / STATE_FILE, msg)

    def _serve(self, op: str, path, msg: Message) -> RecordDict:
        config = msg.content[keys.CONFIG]
        state = protocol.ClientRound.load(json.loads(path.read_text())) if path.exists() else None
        round_number = int(config[keys.ROUND])
        if op == keys.ADVERTISE:
            state, public = protocol.advertise(
                state and state.round, round_number, int(config[keys.SELF])
            )
            out = _key_fields(public)
            content = RecordDict()
        elif state is None:
            raise protocol.Refused(f"a '{op}' message before any key of this node: replayed")
        else:
            if op == keys.SHARE:  # on the keys sent with the last unmask reply, if any
                state = protocol.take_ahead(state, round_number)
            content, out = self._stage(op, state, round_number, msg)
        path.write_text(json.dumps(state.dump()))
        content[keys.CONFIG] = ConfigRecord({keys.ROUND: round_number, **out})
        return content

    def _stage(self, op: str, state, round_number: int, msg: Message) -> tuple[RecordDict, dict]:
        config = msg.content[keys.CONFIG]
        if op == keys.SHARE:
            trios = zip(*(wire.unpack_blobs(config[k]) for k in keys.KEY_TRIO), strict=True)
            neighbourhood = dict(zip(wire.unpack_ids(config[keys.IDS]), trios, strict=True))
            dsts, tokens, seed_hashes, key_hashes, commitment = protocol.share(
                state, round_number, neighbourhood, int(config[keys.THRESHOLD])
            )
            return RecordDict(), {
                keys.DESTINATIONS: wire.ids(dsts),
                keys.CIPHERTEXTS: wire.blobs(tokens),
                keys.SEED_HASHES: wire.blobs(seed_hashes),
                keys.KEY_HASHES: wire.blobs(key_hashes),
                keys.SEED_COMMITMENT: commitment,
            }
        if op == keys.MASK:
            return self._mask(state, round_number, msg)
        if op == keys.CHECK:
            signature = protocol.check(state, round_number, wire.unpack_ids(config[keys.LIVE]))
            return RecordDict(), {keys.SIGNATURES: signature}
        if op == keys.UNMASK:
            signatures = dict(
                zip(
                    wire.unpack_ids(config[keys.IDS]),
                    wire.unpack_blobs(config[keys.SIGNATURES]),
                    strict=True,
                )
            )
            ids, shares = protocol.unmask(
                state,
                round_number,
                wire.unpack_ids(config[keys.LIVE]),
                wire.unpack_ids(config.get(keys.DROPPED, b"")),
                signatures,
            )
            ahead = protocol.advertise_ahead(state)
            return RecordDict(), {
                keys.IDS: wire.ids(ids),
                keys.SHARES: wire.blobs(shares),
                **_key_fields(ahead),
            }
        raise protocol.Refused(f"unknown SecAgg stage {op!r:.40}")

    def _mask(self, state, round_number: int, msg: Message) -> tuple[RecordDict, dict]:
        """Train on the message, then mask the reply's update (in the order of the arrays sent)."""
        config = msg.content[keys.CONFIG]
        state.expect(round_number, "share")  # before training: a replay costs no work
        sent = from_record(msg.content[ARRAYS])
        reply = self.handler.handle(msg)
        trained = from_record(reply[ARRAYS])
        metrics = dict(reply[keys.METRICS])
        if keys.DDP_NOISE in config:  # distributed DP: noised integer rows (ddp.py)
            vector, clipped = self._noised_rows(state, config, trained), 0
        else:
            if set(trained) != set(sent) or any(trained[k].shape != sent[k].shape for k in sent):
                raise ValueError("the trained arrays differ from the model sent")
            num_levels, clip = int(config[keys.LEVELS]), float(config[keys.CLIP])
            vector, clipped = protocol.encode(
                flatten({k: trained[k] for k in sent}),
                float(metrics[config[keys.WEIGHT_KEY]]),
                float(config[keys.MAX_WEIGHT]),
                clip,
                num_levels,
            )
        forwarded = dict(
            zip(
                wire.unpack_ids(config[keys.SOURCES]),
                wire.unpack_blobs(config[keys.CIPHERTEXTS]),
                strict=True,
            )
        )
        masked, kept = protocol.mask(state, round_number, forwarded, vector)
        content = RecordDict(
            {
                keys.MASKED: ArrayRecord({keys.VECTOR: Array(np.asarray(masked, np.uint32))}),
                keys.METRICS: MetricRecord({**metrics, keys.CLIPPED: clipped}),
            }
        )
        return content, {keys.MASKED_WITH: wire.ids(kept)}

    @staticmethod
    def _noised_rows(state, config, trained: dict) -> np.ndarray:
        """Distributed DP: the reply's rows clipped, as integers, with this node's Skellam share
        of the round's noise (``ddp.encode_rows``), from this node's own entropy (nobody else
        can draw it again). The node then signs no live set below the count the share is sized
        for (``protocol.check``)."""
        plan = ddp.NoisePlan(
            float(config[keys.DDP_NOISE]),
            int(config[keys.DDP_BOUND]),
            int(config[keys.DDP_MIN_LIVE]),
            int(config[keys.DDP_COLLUDERS]),
        )
        rows = trained[str(config[keys.DDP_ARRAY])]
        state.min_live = plan.min_live
        rng = np.random.default_rng(secrets.randbits(128))
        return ddp.encode_rows(
            rows, float(config[keys.DDP_CLIP]), bool(config[keys.DDP_SIMPLEX]), plan, rng
        )


def _key_fields(public: dict[str, bytes]) -> dict[str, bytes]:
    """A node's public keys by kind (``protocol.KINDS``) as the reply's fields (``keys.KEY_TRIO``)."""
    return {name: public[kind] for kind, name in zip(protocol.KINDS, keys.KEY_TRIO, strict=True)}
