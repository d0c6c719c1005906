"""Client half of ``strategies/he_fedavg.py``: keep the trained weights, encrypt them chunk by
chunk on request, decrypt the aggregate chunks into this node's copy of the global model.

State lives in a per-node folder on the client's own disk (a SuperNode's or, in simulation,
one per partition under the run's id), since Ray may route a node's messages to any actor.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from fedsim import he
from fedsim.he import blobs_record, record_blobs


def state_dir(root: str | None, run_id: int, partition_id: int) -> Path:
    base = Path(root).expanduser() if root else Path(tempfile.gettempdir()) / "fedsim-clients"
    path = base / f"run-{run_id}" / f"node-{partition_id}"
    path.mkdir(parents=True, exist_ok=True)
    return path


class HEClient:
    """One node's CKKS state: the shared secret context and its weight files."""

    def __init__(self, params: he.CKKSParams, key_dir: str, folder: Path):
        self.params = params
        self.key_dir = key_dir
        self.folder = folder
        self._ctx = None

    @property
    def ctx(self):
        if self._ctx is None:
            self._ctx = he.client_context(self.params, self.key_dir)
        return self._ctx

    def global_weights(self) -> np.ndarray | None:
        path = self.folder / "global.npy"
        return np.load(path) if path.is_file() else None

    def train_reply(self, trained: np.ndarray, metrics: dict) -> RecordDict:
        """Keep the trained flat weights for the chunk requests; reply without any array."""
        if not np.all(np.isfinite(trained)):
            raise ValueError("local update is not finite; refusing to send it")
        np.save(self.folder / "pending.npy", trained.astype(np.float64))
        return RecordDict({
            "metrics": MetricRecord({**metrics, "num-floats": int(trained.size)}),
            "he": ConfigRecord({"public-context": he.public_bytes(self.ctx)}),
        })

    def encrypt(self, msg: Message) -> RecordDict:
        config = msg.content["config"]
        size, chunk = int(config["chunk-floats"]), int(config["chunk"])
        pending = np.load(self.folder / "pending.npy", mmap_mode="r")
        start = time.perf_counter()
        blobs = he.encrypt(self.ctx, pending[chunk * size:(chunk + 1) * size], self.params.slots)
        return RecordDict({"ciphertexts": blobs_record(blobs),
                           "metrics": MetricRecord({"encrypt-seconds":
                                                    time.perf_counter() - start})})

    def install(self, msg: Message) -> RecordDict:
        """Decrypt one aggregate chunk into ``global.partial.npy``; the last one completes it."""
        config = msg.content["config"]
        size, chunk = int(config["chunk-floats"]), int(config["chunk"])
        total, last = int(config["num-floats"]), chunk == int(config["num-chunks"]) - 1
        start = time.perf_counter()
        values = he.decrypt(self.ctx, record_blobs(msg.content["ciphertexts"]))
        seconds = time.perf_counter() - start
        n = min(size, total - chunk * size)
        if not np.all(np.isfinite(values[:n])):
            raise ValueError(f"decrypted aggregate chunk {chunk} is not finite")
        partial = self.folder / "global.partial.npy"
        mode = "w+" if chunk == 0 or not partial.is_file() else "r+"
        out = np.lib.format.open_memmap(partial, mode=mode, dtype=np.float64, shape=(total,))
        out[chunk * size:chunk * size + n] = values[:n]
        out.flush()
        del out
        if last:
            os.replace(partial, self.folder / "global.npy")
        return RecordDict({"metrics": MetricRecord({"decrypt-seconds": seconds})})
