"""What a client's machine decides for itself, never a message: where its data, its client state,
its CKKS key folder and its corpus-embedding cache are.

A message is the server's to write. A server that names a folder on a client's machine can have
the client remove it (the end-of-run forget removes ``<root>/run-<key>/`` under the root it is
given), create folders anywhere, create the federation's secret CKKS key where it can read it or
load one it planted, fill or read a cache of its choosing, or train on any folder the client can
read. So each of these is node configuration, looked up in this order:

1. the SuperNode's node config key (``flower-supernode --node-config 'state-dir="/srv/state"'``);
2. the client process's environment variable: how ``fedsim run``, the local operator of the
   clients it starts, hands its run config's values (``data_root``, ``client_state.dir``,
   ``task.he.key_dir``, ``task.embedding_cache``) to a simulation's Ray clients, which inherit the
   environment of the SuperLink it starts (its local SuperNodes get the node config keys too);
3. the default: the data root beside the checkout, ``<tmp>/fedsim-clients-<uid>``, ``~/.cache/fedsim/he_keys``,
   no embedding cache (a run-local store).

The server sends none of them (:func:`sent_task`), and the ClientApp writes the node's own values
into each message's config (:func:`attach`) before any handler reads them (:func:`setting`),
replacing whatever a server put there.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping

from flwr.app import ConfigRecord, Message
from omegaconf import DictConfig, OmegaConf

from fedsim.config.data import ENV_VAR as DATA_ROOT_ENV
from fedsim.message_keys import CONFIG

NODE_KEY = "fedsim-node"  # config entry the ClientApp fills with the node's values (JSON)
SETTINGS = {  # node config key: (environment variable, the run config key fedsim run gives it from)
    "data-root": (DATA_ROOT_ENV, "data_root"),
    "state-dir": ("FEDSIM_STATE_DIR", "client_state.dir"),
    "he-key-dir": ("FEDSIM_HE_KEY_DIR", "task.he.key_dir"),
    "embedding-cache": ("FEDSIM_EMBEDDING_CACHE", "task.embedding_cache"),
}
DEFAULTS = {"he-key-dir": "~/.cache/fedsim/he_keys"}  # the others: None (their users' defaults)
TASK_COPIES = [
    ["data_root"],
    *(path.split(".")[1:] for _, path in SETTINGS.values() if path.startswith("task.")),
]


def from_run(cfg: DictConfig) -> dict[str, str]:
    """The run config's node-local values, by node config key (what ``fedsim run`` gives the
    clients it starts); a key the run leaves null or lacks is left out."""
    values = {key: OmegaConf.select(cfg, path) for key, (_, path) in SETTINGS.items()}
    return {key: str(value) for key, value in values.items() if value is not None}


def environment(cfg: DictConfig, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each variable set to the run config's value, or removed where the run sets
    none: the run's clients follow the run config, not whatever the user's shell exported."""
    given = from_run(cfg)
    out = {k: v for k, v in env.items() if k not in {var for var, _ in SETTINGS.values()}}
    return {**out, **{SETTINGS[key][0]: value for key, value in given.items()}}


def supernode_config(values: Mapping[str, str]) -> str:
    """``--node-config`` entries for ``values`` (node config key -> value)."""
    return " ".join(f'{key}="{value}"' for key, value in values.items())


def resolve(node_config: Mapping) -> dict[str, str | None]:
    """This node's values: its node config, else this process's environment, else the default."""
    values = {
        key: node_config.get(key) or os.environ.get(var) or DEFAULTS.get(key)
        for key, (var, _) in SETTINGS.items()
    }
    return {key: None if value is None else str(value) for key, value in values.items()}


def attach(msg: Message, node_config: Mapping) -> None:
    """Write the node's values into ``msg``'s config, over anything the server sent there."""
    if not isinstance(msg.content.get(CONFIG), ConfigRecord):  # one lookup, not every record
        msg.content[CONFIG] = ConfigRecord()
    msg.content[CONFIG][NODE_KEY] = json.dumps(resolve(node_config))


def setting(msg: Message, key: str) -> str | None:
    """The node's value of ``key`` for a handler serving ``msg`` (:func:`attach` put it there;
    a handler called directly, as in tests, gets this process's own)."""
    config = msg.content.get(CONFIG)
    raw = config.get(NODE_KEY) if isinstance(config, ConfigRecord) else None
    return (json.loads(raw) if raw else resolve({}))[key]


def sent_task(task: dict, reads_data: bool = True) -> dict:
    """The task config a message carries: without its node-local keys, which no client reads
    from a message (and the task's copy of the run's data root, ``conf/task/*.yaml``). A task
    that reads no data (``fedsim.config.data.reads_data``) carries ``data_root: null`` instead, so
    its clients look for no data root either."""
    task = copy.deepcopy(task)
    for *parents, leaf in TASK_COPIES:
        folder = task
        for part in parents:
            folder = folder.get(part) or {}
        folder.pop(leaf, None)
    return task if reads_data else {**task, "data_root": None}
