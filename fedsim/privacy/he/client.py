"""Client half of HE averaging (server half: ``fedsim_strategies/he_fedavg.py``): keep the trained
weights, encrypt them chunk by chunk on request, decrypt the aggregate chunks into this node's
copy of the global model.

State lives in a per-node folder on the client's own disk (a SuperNode's or, in simulation,
one per partition under the run's id), since Ray may route a node's messages to any actor.
A round's aggregate becomes the node's global copy only when every one of its chunks was
installed (``global-<round>.npy``, created by an atomic rename); a copy that is missing chunks
is never used.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from fedsim.privacy.he import ckks
from fedsim.privacy.he import messages as keys


class IncompleteGlobal(RuntimeError):
    """The node does not hold the complete aggregate it was asked to use."""


def is_he_operation(msg: Message) -> bool:
    """Whether a QUERY message is a chunk operation for :meth:`HEClient.handle`."""
    config = msg.content.config_records.get(keys.CONFIG)
    return config is not None and keys.OP in config


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class HEClient:
    """One node's CKKS state: the shared secret context and its weight files."""

    def __init__(self, params: ckks.CKKSParams, key_dir: str, folder: Path):
        self.params = params
        self.key_dir = key_dir
        self.folder = folder
        self._ctx = None
        self._key_id = None

    @property
    def ctx(self):
        if self._ctx is None:
            self._ctx = ckks.client_context(self.params, self.key_dir)
        return self._ctx

    @property
    def key_id(self) -> str:
        if self._key_id is None:
            self._key_id = ckks.key_id(ckks.public_bytes(self.ctx))
        return self._key_id

    def check_key(self, config) -> None:
        """Refuse a message made under another key (or naming none): a node whose key folder
        differs would decrypt the aggregate into garbage and install it as its global model."""
        named = config.get(keys.KEY_ID)
        if named != self.key_id:
            raise ckks.WrongKey(
                f"the message is under key {named!r}, this node holds {self.key_id}: "
                "another key (copy the federation's key folder to this node)"
            )

    def global_weights(self, server_round: int) -> np.ndarray:
        """The complete aggregate of ``server_round``; raises when this node lacks it."""
        path = self.folder / f"global-{server_round}.npy"
        if not path.is_file():
            held = sorted(p.stem for p in self.folder.glob("global-*.npy"))
            partial = self.folder / "global.partial.json"
            detail = json.loads(partial.read_text()) if partial.is_file() else "none"
            raise IncompleteGlobal(
                f"holds no complete HE aggregate of round {server_round} "
                f"(complete: {held or 'none'}; partial: {detail})"
            )
        return np.load(path)

    def train_reply(self, trained: np.ndarray, metrics: dict, inline_floats: int = 0) -> RecordDict:
        """An update of at most ``inline_floats`` floats goes encrypted in the reply (one round
        trip); a larger one is kept for the chunk requests and the reply carries no array."""
        if not np.all(np.isfinite(trained)):
            raise ValueError("local update is not finite; refusing to send it")
        content = RecordDict(
            {keys.CONTEXT: ConfigRecord({keys.PUBLIC_CONTEXT: ckks.public_bytes(self.ctx)})}
        )
        metrics = {**metrics, keys.NUM_FLOATS: int(trained.size)}
        if 0 < trained.size <= inline_floats:
            start = time.perf_counter()
            content[keys.CIPHERTEXTS] = ckks.blobs_record(
                ckks.encrypt(self.ctx, trained, self.params.slots)
            )
            metrics[keys.ENCRYPT_SECONDS] = time.perf_counter() - start
        else:
            np.save(self.folder / "pending.npy", trained.astype(np.float64))
        content[keys.METRICS] = MetricRecord(metrics)
        return content

    def install_carried(self, msg: Message) -> float:
        """Install the previous round's aggregate that a train message carries (one-trip HE);
        the decrypt seconds (0 when it carries none)."""
        if keys.CIPHERTEXTS not in msg.content.array_records:
            return 0.0
        config = msg.content[keys.CONFIG]
        self.check_key(config)
        total = int(config[keys.NUM_FLOATS])
        return self._install(
            msg.content[keys.CIPHERTEXTS], int(config[keys.INSTALL_ROUND]), 0, 1, total, total
        )

    def handle(self, msg: Message) -> RecordDict:
        """The chunk operation the message names (see :func:`is_he_operation`)."""
        op = msg.content[keys.CONFIG][keys.OP]
        self.check_key(msg.content[keys.CONFIG])
        if op == keys.ENCRYPT:
            return self.encrypt(msg)
        if op == keys.INSTALL:
            return self.install(msg)
        raise ValueError(f"unknown HE operation {op!r}")

    def encrypt(self, msg: Message) -> RecordDict:
        config = msg.content[keys.CONFIG]
        size, chunk = int(config[keys.CHUNK_FLOATS]), int(config[keys.CHUNK])
        pending = np.load(self.folder / "pending.npy", mmap_mode="r")
        start = time.perf_counter()
        blobs = ckks.encrypt(
            self.ctx, pending[chunk * size : (chunk + 1) * size], self.params.slots
        )
        return RecordDict(
            {
                keys.CIPHERTEXTS: ckks.blobs_record(blobs),
                keys.CONTEXT: ConfigRecord({keys.KEY_ID: self.key_id}),
                keys.METRICS: MetricRecord({keys.ENCRYPT_SECONDS: time.perf_counter() - start}),
            }
        )

    def install(self, msg: Message) -> RecordDict:
        """Decrypt one aggregate chunk into the round's partial copy; the copy becomes the
        global model when all of the round's chunks are in."""
        config = msg.content[keys.CONFIG]
        seconds = self._install(
            msg.content[keys.CIPHERTEXTS],
            int(config[keys.SERVER_ROUND]),
            int(config[keys.CHUNK]),
            int(config[keys.NUM_CHUNKS]),
            int(config[keys.NUM_FLOATS]),
            int(config[keys.CHUNK_FLOATS]),
        )
        return RecordDict({keys.METRICS: MetricRecord({keys.DECRYPT_SECONDS: seconds})})

    def _install(
        self, ciphertexts, rnd: int, chunk: int, num_chunks: int, total: int, size: int
    ) -> float:
        """Decrypt chunk ``chunk`` of round ``rnd``'s aggregate into the copy; the decrypt seconds."""
        n = min(size, total - chunk * size)
        start = time.perf_counter()
        values = ckks.decrypt(
            self.ctx,
            ckks.record_blobs(
                ciphertexts, math.ceil(n / self.params.slots), self.params.ciphertext_bytes
            ),
        )
        seconds = time.perf_counter() - start
        if not np.all(np.isfinite(values[:n])):
            raise ValueError(f"decrypted aggregate chunk {chunk} is not finite")
        state_path, partial = (
            self.folder / "global.partial.json",
            self.folder / "global.partial.npy",
        )
        state = json.loads(state_path.read_text()) if state_path.is_file() else {}
        fresh = state.get("round") != rnd or not partial.is_file()
        if fresh:  # a new round's copy starts empty, whichever chunk arrives first
            state = {"round": rnd, "num-chunks": num_chunks, "installed": []}
        out = np.lib.format.open_memmap(
            partial, mode="w+" if fresh else "r+", dtype=np.float64, shape=(total,)
        )
        out[chunk * size : chunk * size + n] = values[:n]
        out.flush()
        del out
        state["installed"] = sorted(set(state["installed"]) | {chunk})
        if len(state["installed"]) == num_chunks:
            os.replace(partial, self.folder / f"global-{rnd}.npy")
            state_path.unlink(missing_ok=True)
            for old in self.folder.glob("global-*.npy"):
                if old.stem != f"global-{rnd}":
                    old.unlink()
        else:
            _write_json(state_path, state)
        return seconds
