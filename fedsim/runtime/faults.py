"""Fault injection as a ClientApp mod, so tests break real clients inside a real simulation.

The server puts a JSON spec in the message's config under ``fedsim-faults`` (``faults`` in
``conf/config.yaml``): partition ids per fault kind, ``timeout_seconds`` and the
``message_types`` whose replies are affected (default: train). Corruptions work on any reply:
the first array when the reply carries arrays, else the first metric (e.g. an HE train reply,
which carries only metrics and the public context); ``uninflatable`` needs an array.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache

import numpy as np
from flwr.app import Array, Context, Message, MetricRecord

from fedsim.message_keys import CONFIG, NODE_PARTITION_ID
from fedsim.runtime.records import config_record

FAULTS_KEY = "fedsim-faults"
KINDS = ("crash", "timeout", "nan", "wrong_length", "negative", "uninflatable")


class InjectedFault(RuntimeError):
    pass


def _corrupt_array(record, kind: str) -> None:
    key = next(iter(record.keys()))
    if (
        kind == "uninflatable"
    ):  # a declared shape Flower's Array.inflate refuses: the bytes stay valid
        record[key].shape = ("uninflatable",)
        return
    rows = record[key].numpy().astype(float).copy()
    if kind == "nan":
        rows[..., 0] = np.nan
    elif kind == "wrong_length":
        rows = rows[..., :-1]
    else:  # negative
        rows[..., 0] = -0.5
    record[key] = Array(rows)


def _corrupt_metric(record: MetricRecord, kind: str) -> None:
    key = next(iter(record.keys()))
    if kind == "wrong_length":
        del record[key]
    else:
        record[key] = float("nan") if kind == "nan" else -0.5


def _corrupt(reply: Message, kind: str) -> Message:
    content = reply.content
    if content.array_records and len(next(iter(content.array_records.values()))):
        _corrupt_array(next(iter(content.array_records.values())), kind)
    elif (
        kind != "uninflatable"
        and content.metric_records
        and len(next(iter(content.metric_records.values())))
    ):
        _corrupt_metric(next(iter(content.metric_records.values())), kind)
    else:
        raise InjectedFault(f"nothing to corrupt ({kind}) in a reply without arrays or metrics")
    return reply


@lru_cache(maxsize=8)
def _spec(text: str) -> dict:
    """Parsed once per spec: a SuperNode hosting many clients sees the same one thousands of times."""
    return json.loads(text)


def _spec_of(msg: Message) -> dict:
    config = config_record(msg.content, CONFIG)
    return _spec(str(config[FAULTS_KEY])) if config and FAULTS_KEY in config else {}


def hits(msg: Message, partition_id: int) -> list[str]:
    """The faults the message's spec injects on partition ``partition_id`` (none: it passes)."""
    spec = _spec_of(msg)
    found = [kind for kind in KINDS if partition_id in spec.get(kind, [])]
    return found if found and msg.metadata.message_type in spec["message_types"] else []


def fault_injection_mod(msg: Message, context: Context, call_next) -> Message:
    partition_id = int(context.node_config.get(NODE_PARTITION_ID, -1))
    hits_here = hits(msg, partition_id)
    if not hits_here:
        return call_next(msg, context)
    if "crash" in hits_here:
        raise InjectedFault(f"injected crash on partition {partition_id}")
    if "timeout" in hits_here:
        time.sleep(float(_spec_of(msg)["timeout_seconds"]))
    reply = call_next(msg, context)
    for kind in hits_here:
        if kind != "timeout":
            reply = _corrupt(reply, kind)
    return reply
