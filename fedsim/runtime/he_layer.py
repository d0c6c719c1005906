"""HE as a layer around any client handler that exchanges weights (``fedsim_clients/handler.py``).

The ClientApp wraps a task's handler in :class:`HELayer` when the task carries CKKS parameters
(``task.he``: :func:`around`); the handler then never sees a ciphertext. On the way in, a message
that names an aggregate (``he-global-round``: HEFedAvg's train messages, an evaluation of its
result) first installs the encrypted aggregate a one-trip train message carries, then gets that
round's complete aggregate, decrypted from this node's copy (round 0: the handler's
``initial_weights``), as its arrays. On the way out, the reply of an HE train message goes
encrypted (one trip) or is kept for the chunk requests, which the layer answers itself
(``fedsim/privacy/he/client.py``; the server half: ``fedsim_strategies/he_fedavg.py``).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from flwr.app import Message, RecordDict

from fedsim.config import node_local
from fedsim.message_keys import ARRAYS
from fedsim.privacy.he import messages as keys
from fedsim.privacy.he.ckks import CKKSParams
from fedsim.privacy.he.client import HEClient, IncompleteGlobal, is_he_operation
from fedsim.runtime import client_state
from fedsim.runtime.records import from_record, to_record


def flatten(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Named arrays as one float64 vector, in their order (what CKKS encrypts)."""
    return np.concatenate([a.ravel() for a in arrays.values()]).astype(np.float64)


def unflatten(flat: np.ndarray, like: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
    """``flat`` as the named arrays of ``like`` (their shapes and dtypes)."""
    out, start = OrderedDict(), 0
    for name, ref in like.items():
        out[name] = flat[start : start + ref.size].reshape(ref.shape).astype(ref.dtype)
        start += ref.size
    if start != flat.size:
        raise ValueError(f"flat vector has {flat.size} values, model needs {start}")
    return out


def around(handler, task: dict):
    """``handler`` in an HE layer where the task carries CKKS parameters (``task.he``), else itself."""
    he = task.get("he")
    if not he:
        return handler
    return HELayer(
        handler,
        CKKSParams(
            he["poly_modulus_degree"], tuple(he["coeff_mod_bit_sizes"]), he["global_scale_bits"]
        ),
    )


class HELayer:
    """A handler's messages through this node's CKKS state: the handler sees plaintext weights only."""

    def __init__(self, handler, params: CKKSParams):
        self.handler, self.params = handler, params
        self._clients: dict[str, HEClient] = {}

    def he(self, msg: Message) -> HEClient:
        """This node's HE state for the message's run, kept so the secret context is read from
        the node's key folder once, not on every chunk."""
        run = client_state.run_key(msg)
        if run not in self._clients:
            self._clients[run] = HEClient(
                self.params,
                node_local.setting(msg, "he-key-dir"),
                client_state.of(msg, self.handler.partition_id).folder,
            )
        return self._clients[run]

    def handle(self, msg: Message) -> RecordDict:
        if is_he_operation(msg):
            return self.he(msg).handle(msg)
        config = msg.content[keys.CONFIG]
        if keys.GLOBAL_ROUND not in config:
            return self.handler.handle(msg)
        he_round = bool(config.get(keys.HE_ROUND, False))
        decrypt = (
            self.he(msg).install_carried(msg) if he_round else 0.0
        )  # one trip: the last aggregate
        msg.content[ARRAYS] = to_record(self._aggregate(msg, int(config[keys.GLOBAL_ROUND])))
        reply = self.handler.handle(msg)
        if not he_round:
            return reply
        metrics = {**reply[keys.METRICS], keys.DECRYPT_SECONDS: decrypt}
        return self.he(msg).train_reply(
            flatten(from_record(reply[ARRAYS])), metrics, int(config.get(keys.INLINE_FLOATS, 0))
        )

    def _aggregate(self, msg: Message, server_round: int) -> dict[str, np.ndarray]:
        """The complete aggregate of ``server_round`` this node holds (0: the common initial weights)."""
        initial = self.handler.initial_weights(msg)
        if server_round == 0:
            return initial
        try:
            return unflatten(self.he(msg).global_weights(server_round), initial)
        except IncompleteGlobal as exc:
            raise IncompleteGlobal(f"node {self.handler.partition_id} {exc}") from exc
