"""The one ClientApp of the platform: it builds the task's client named in the message.

The server sends the resolved task config (JSON under ``fedsim-task``) with every message, so a
client process never composes Hydra and any strategy that forwards its config record works.
The client object is cached per process: Ray actors serve many nodes and messages. A message
for several logical clients of one SuperNode (``hardware.clients_per_supernode``) is served
client by client, each with its own partition id and the mods (``fedsim/runtime/sharded_grid.py``).
Before each client's handler runs, the process's random state is reseeded from the run's seed,
the round, the partition and the message type (``fedsim/seeding.py``): a reply never depends on
which clients the same process served before.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import adaptiveclipping_mod

from fedsim.code_policy import allowed_code
from fedsim.config import node_local
from fedsim.config.data import resolve_data_root
from fedsim.flower.strategies import KEY_CLIPPING_NORM, make_ffn
from fedsim.message_keys import (
    CONFIG,
    NODE_NUM_PARTITIONS,
    NODE_PARTITION_ID,
    PARTITION_ID,
    RAY_NODE,
    SERVER_ROUND,
)
from fedsim.runtime import client_state, exchange_trace, he_layer, secagg_layer
from fedsim.runtime.faults import fault_injection_mod, hits
from fedsim.runtime.journal import WHOAMI
from fedsim.runtime.records import config_record
from fedsim.runtime.sharded_grid import SHARD, serve_batch
from fedsim.seeding import PROCESS, reseed

TASK_KEY = "fedsim-task"
SEED_KEY = "fedsim-seed"
exchange_trace.mark_process_start()
exchange_trace.mark("app-import")


def dp_clipping_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's client-side clipping for its client-side DP wrappers, on the train messages that
    carry their clipping norm only: Flower's mod refuses any message without exactly one
    ArrayRecord (every discovery, query and evaluate message here). The adaptive mod clips
    exactly as the fixed one and also reports whether it clipped, which the adaptive wrapper
    needs and the fixed one ignores, so one mod serves both. Flower's clipping writes the
    update in the dtype of the model received (float64 after FedAdam, say); the reply keeps the
    dtype the client trained in, which the server's reply check expects."""
    config = config_record(msg.content, CONFIG) or {}
    if msg.metadata.message_type != MessageType.TRAIN or KEY_CLIPPING_NORM not in config:
        return call_next(msg, context)
    dtypes = {}

    def trained(m: Message, c: Context) -> Message:
        reply = call_next(m, c)
        if not reply.has_error():
            dtypes.update(
                {k: a.dtype for r in reply.content.array_records.values() for k, a in r.items()}
            )
        return reply

    out = adaptiveclipping_mod(msg, context, trained)
    if not out.has_error():
        for name, record in list(out.content.array_records.items()):
            out.content[name] = ArrayRecord(
                {k: Array(a.numpy().astype(dtypes[k])) for k, a in record.items()}
            )
    return out


MODS = [fault_injection_mod, dp_clipping_mod]  # faults outermost: they corrupt what was clipped
app = ClientApp(mods=MODS)


@lru_cache(maxsize=64)
def _client(task_json: str, data_root: str, partition_id: int, num_partitions: int):
    """The task's handler (``fedsim_clients/handler.py``), in the HE layer where the task carries
    CKKS parameters (``fedsim/runtime/he_layer.py``), in the SecAgg+ layer, which answers the
    messages of a SecAgg+ round only (``fedsim/runtime/secagg_layer.py``). The message names it:
    only a class of fedsim's may be built (``fedsim/code_policy.py``), else the message gets an
    error reply."""
    task = json.loads(task_json)  # each client its own dict: no handler sees another's changes
    handler = _handler_class(task["client"])
    inner = he_layer.around(handler(task, data_root, partition_id, num_partitions), task)
    return secagg_layer.SecAggLayer(inner, partition_id)


@lru_cache(maxsize=16)
def _handler_class(path: str):
    """The handler class a task names, checked and imported once per process: a SuperNode
    hosting thousands of clients builds one handler per client and message (``_client``'s
    cache holds 64), and the check and lookup cost 0.13 ms each time."""
    return allowed_code(path, "task.client")


@lru_cache(maxsize=16)
def _data_root(node_root: str | None, task_json: str) -> str:
    """The node's data root (``fedsim/config/node_local.py``), resolved once: a SuperNode hosting many
    logical clients answers thousands of messages. "" for a task that reads no data (its
    ``data_root`` is null in the message, ``fedsim/config/node_local.py``'s ``sent_task``)."""
    if json.loads(task_json).get("data_root", "") is None:
        return ""
    return str(resolve_data_root(node_root))


def message_seed(msg: Message, partition_id: int) -> int:
    """The seed of one client's work on one message: the run's seed (``client_config``), the
    round (Flower's strategies put ``server-round`` in the config; 0 for other phases), the
    partition and the message type. Nothing in it depends on scheduling or node ids."""
    config = msg.content[CONFIG]
    return PROCESS.seed(
        config.get(SEED_KEY, 0),
        round=config.get(SERVER_ROUND, 0),
        partition=partition_id,
        message_type=msg.metadata.message_type,
    )


def ray_node() -> dict[str, str]:
    """The Ray node this process runs on where it is a simulation's Ray actor (Ray is imported
    there already; elsewhere nothing is imported): the run's provenance counts the clients each
    node of a Ray cluster served."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return {}
    return {RAY_NODE: ray.get_runtime_context().get_node_id()}


def _client_reply(msg: Message, context: Context) -> Message:
    if config_record(msg.content, WHOAMI) is not None:  # the Messenger maps node ids to partitions
        record = ConfigRecord(
            {PARTITION_ID: int(context.node_config[NODE_PARTITION_ID]), **ray_node()}
        )
        return Message(RecordDict({WHOAMI: record}), reply_to=msg)
    node_local.attach(msg, context.node_config)  # this node's folders, never the server's
    if (
        config_record(msg.content, client_state.FORGET) is not None
    ):  # the run ended: its client state goes
        removed = client_state.forget(msg)
        return Message(
            RecordDict({client_state.FORGET: ConfigRecord({"removed": removed})}), reply_to=msg
        )
    task_json = msg.content[CONFIG][TASK_KEY]
    partition_id = int(context.node_config[NODE_PARTITION_ID])
    exchange_trace.mark("enter", msg.metadata.message_id)
    client = _client(
        task_json,
        _data_root(node_local.setting(msg, "data-root"), task_json),
        partition_id,
        int(context.node_config[NODE_NUM_PARTITIONS]),
    )
    exchange_trace.mark("built", msg.metadata.message_id)
    reseed(message_seed(msg, partition_id))  # after building the client: it may import torch
    reply = Message(client.handle(msg), reply_to=msg)
    exchange_trace.mark("leave", msg.metadata.message_id)
    return reply


def _rows_reply(msg: Message, partitions: list[int], num_partitions: int, context: Context):
    """The train replies of the clients ``partitions`` of a batch that all got ``msg``, as
    their columns, from the task's handler class's ``train_rows`` (``fedsim_clients/
    handler.py``) where every layer a client's message goes through would pass it unchanged:
    no fault injected on any of them, no client-side clipping, no SecAgg+ stage, no HE. None
    (served client by client): any of those, or a handler whose ``train_rows`` gives none."""
    config = config_record(msg.content, CONFIG)
    if msg.metadata.message_type != MessageType.TRAIN or config is None or TASK_KEY not in config:
        return None
    task = json.loads(config[TASK_KEY])
    if (
        KEY_CLIPPING_NORM in config
        or task.get("he")
        or not secagg_layer.SecAggLayer.passes(msg)
        or any(hits(msg, p) for p in partitions)
    ):
        return None
    node_local.attach(msg, context.node_config)
    data_root = _data_root(node_local.setting(msg, "data-root"), config[TASK_KEY])
    rows = _handler_class(task["client"]).train_rows
    return rows(task, data_root, partitions, num_partitions, msg)


@app.query()
@app.train()
@app.evaluate()
def handle(msg: Message, context: Context) -> Message:
    """Every message type: the handler dispatches by type (``fedsim_clients/handler.py``)."""
    if (
        config_record(msg.content, SHARD) is not None
    ):  # several logical clients: each through the mods, or all at once where they would pass
        return serve_batch(msg, context, make_ffn(_client_reply, MODS), _rows_reply)
    return _client_reply(msg, context)
