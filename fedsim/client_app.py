"""The one ClientApp of the platform: it builds the task's client named in the message.

The server sends the resolved task config (JSON under ``fedsim-task``) with every message, so a
client process never composes Hydra and any strategy that forwards its config record works.
The client object is cached per process: Ray actors serve many nodes and messages.
"""

from __future__ import annotations

import json
from functools import lru_cache

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from hydra.utils import get_class

from fedsim.data import resolve_data_root
from fedsim.faults import fault_injection_mod
from fedsim.journal import PARTITION, WHOAMI

TASK_KEY = "fedsim-task"
RUN_KEY = "fedsim-run-key"


def run_key(msg: Message) -> str:
    """The key of the run a message belongs to, stable across a resume (``client_config``);
    Flower's run id where the server sent none."""
    config = msg.content.config_records.get("config")
    return str(config[RUN_KEY]) if config is not None and RUN_KEY in config else str(msg.metadata.run_id)

app = ClientApp(mods=[fault_injection_mod])


@lru_cache(maxsize=64)
def _client(task_json: str, data_root: str, partition_id: int, num_partitions: int):
    task = json.loads(task_json)
    return get_class(task["client"])(task, data_root, partition_id, num_partitions)


def _handle(msg: Message, context: Context, method: str) -> Message:
    task_json = msg.content["config"][TASK_KEY]
    explicit = context.node_config.get("data-root") or json.loads(task_json).get("data_root")
    client = _client(task_json, str(resolve_data_root(explicit)),
                     int(context.node_config["partition-id"]),
                     int(context.node_config["num-partitions"]))
    return Message(getattr(client, method)(msg), reply_to=msg)


@app.query()
def query(msg: Message, context: Context) -> Message:
    if WHOAMI in msg.content.config_records:  # the Messenger maps node ids to partitions
        record = ConfigRecord({PARTITION: int(context.node_config["partition-id"])})
        return Message(RecordDict({WHOAMI: record}), reply_to=msg)
    return _handle(msg, context, "query")


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _handle(msg, context, "train")


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _handle(msg, context, "evaluate")
