"""Fault injection as a ClientApp mod, so tests break real clients inside a real simulation.

The server puts a JSON spec in the message's config under ``fedsim-faults``; it applies to train
messages (the ones strategies aggregate):
``{"raise": [pid], "timeout": [pid], "nan": [pid], "wrong_length": [pid], "negative": [pid],
"timeout_seconds": s}`` (partition ids). The mod leaves every other message untouched.
"""

from __future__ import annotations

import json
import time

import numpy as np
from flwr.app import Array, Context, Message, MessageType

FAULTS_KEY = "fedsim-faults"
KINDS = ("raise", "timeout", "nan", "wrong_length", "negative")


class InjectedFault(RuntimeError):
    pass


def _corrupt(reply: Message, kind: str) -> Message:
    record = next(iter(reply.content.array_records.values()))
    key = next(iter(record.keys()))
    rows = record[key].numpy().astype(float).copy()
    if kind == "nan":
        rows[..., 0] = np.nan
    elif kind == "wrong_length":
        rows = rows[..., :-1]
    elif kind == "negative":
        rows[..., 0] = -0.5
    record[key] = Array(rows)
    return reply


def fault_injection_mod(msg: Message, context: Context, call_next) -> Message:
    config = msg.content.config_records.get("config")
    spec = json.loads(config[FAULTS_KEY]) if config and FAULTS_KEY in config else {}
    pid = int(context.node_config.get("partition-id", -1))
    hits = [kind for kind in KINDS if pid in spec.get(kind, [])]
    if not hits or msg.metadata.message_type != MessageType.TRAIN:
        return call_next(msg, context)
    if "raise" in hits:
        raise InjectedFault(f"injected crash on partition {pid}")
    if "timeout" in hits:
        time.sleep(float(spec.get("timeout_seconds", 30)))
    reply = call_next(msg, context)
    for kind in hits:
        if kind != "timeout":
            reply = _corrupt(reply, kind)
    return reply
