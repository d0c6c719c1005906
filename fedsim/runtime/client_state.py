"""Client state that lives across the rounds of a run (a client's own model, HE's global copy,
a run's embedding store): one platform mechanism, on the client's machine, never sent to the
server.

Where: ``<root>/run-<run key>/client-<partition id>/``. The root is the node's own
(``fedsim/config/node_local.py``): the SuperNode's node config ``state-dir``, else ``$FEDSIM_STATE_DIR``
(``fedsim run`` sets it from ``client_state.dir`` for the clients it starts), else
``<tmp>/fedsim-clients-<uid>``, owner-only; never a message's (a server that named the root could remove or create
folders anywhere on the client's machine). The run key (``client_state.run_key``,
shown in the run's config.yaml) is drawn from the run's secret (``fedsim/privacy/secret.py``): the same
when a run is resumed, unlike Flower's run id, and new for every fresh run, even in a results
folder that an earlier run used (whose clients may have kept their state there: keyed by the
folder, a fresh run would read the earlier run's values and prune its own as older).

Why not Flower's ``Context.state``: it is one RecordDict per SuperNode, so the many logical
clients of a sharded SuperNode (``hardware.clients_per_supernode``) would share it; it sits in
the node's memory (a full model per client); and a resumed run is a new Flower run whose
contexts start empty. A folder keyed by the run key has none of these limits.

Versions: a value is saved with the round that made it and read as "the newest before round
t". A run killed after a client saved round t but before the server journaled round t sends
round t again when resumed; the client reads round t-1's value and does the same work again, so
a resumed run ends with the client states of an uninterrupted one. The two newest versions are
kept: disk per client and name is two copies of the value (``bytes`` reports it).

End: when a run completes, the ServerApp asks every node to forget it
(:func:`forget_request`); the node removes the run's folder under its own root unless
``client_state.keep``. The key is the server's and only a plain name: a server can have a node
remove any run's folder under that root, nothing outside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Message

from fedsim.config.node_local import setting
from fedsim.message_keys import CONFIG
from fedsim.privacy.secret import private_folder
from fedsim.runtime.records import config_record

RUN_KEY = "fedsim-run-key"  # config: the run's key, stable across a resume
STATE_KEY = "fedsim-client-state"  # config: JSON {"keep": bool}, in every message
FORGET = "fedsim-forget"  # config record of the end-of-run query: {run key entry}
KEPT_VERSIONS = 2


def run_key(msg: Message) -> str:
    """The key of the run a message belongs to, stable across a resume (``client_config``);
    Flower's run id where the server sent none."""
    config = config_record(msg.content, CONFIG)
    return (
        str(config[RUN_KEY])
        if config is not None and RUN_KEY in config
        else str(msg.metadata.run_id)
    )


def _kept(msg: Message) -> bool:
    """Whether the run asks its clients to keep their state after it completes."""
    config = config_record(msg.content, CONFIG)
    raw = config.get(STATE_KEY) if config is not None else None
    return bool(json.loads(raw).get("keep", False)) if raw else False


def root(msg: Message) -> str | None:
    """The node's own root for client state (None: the default under the temporary folder)."""
    return setting(msg, "state-dir")


def _run_path(root: str | None, key: str) -> Path:
    """The run's folder; ``key`` comes from the server's message, so only a plain name is
    accepted (a key like ``../..`` would let a server write or remove outside the root)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
        raise ValueError(f"run key {key!r}: letters, digits, '_' and '-' only")
    return _base(root) / f"run-{key}"


def _base(root: str | None) -> Path:
    """The root; the default is per user (a root is owner-only, so two users cannot share one)."""
    return (
        Path(root).expanduser()
        if root
        else Path(tempfile.gettempdir()) / f"fedsim-clients-{os.getuid()}"
    )


def run_dir(root: str | None, key: str) -> Path:
    """One run's folder of client state, shared by the clients of one machine. The root must be
    this user's and owner-only (another local user who made it, or can enter it, could read the
    clients' models and DP-SGD ledgers or swap them between rounds), and so is what is made in it."""
    private_folder(_base(root))
    path = _run_path(root, key)
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def client_dir(root: str | None, key: str, partition_id: int) -> Path:
    """One client's private folder within its run's."""
    path = run_dir(root, key) / f"client-{partition_id}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


class ClientState:
    """Named arrays of one client, versioned by round (``.npz``, no pickle)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def _versions(self, name: str) -> list[tuple[int, Path]]:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
            raise ValueError(f"state name {name!r}: letters, digits, '.', '_' and '-' only")
        found = (
            (re.fullmatch(rf"{re.escape(name)}\.r(\d+)\.npz", p.name), p)
            for p in self.folder.iterdir()
        )
        return sorted((int(m.group(1)), p) for m, p in found if m)

    def load(self, name: str, before_round: int) -> dict[str, np.ndarray] | None:
        """The newest value of ``name`` saved in a round before ``before_round``; None if none."""
        older = [p for r, p in self._versions(name) if r < before_round]
        if not older:
            return None
        with np.load(older[-1], allow_pickle=False) as data:
            return {k: data[k] for k in data.files}

    def save(self, name: str, server_round: int, arrays: dict[str, np.ndarray]) -> None:
        """Write round ``server_round``'s value (whole or not at all), keep the newest versions."""
        if any(np.asarray(a).dtype.hasobject for a in arrays.values()):
            raise ValueError(f"state {name!r}: object arrays would be pickled; numbers only")
        self._versions(name)  # checks the name
        tmp = self.folder / f".{name}.r{server_round}.tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, self.folder / f"{name}.r{server_round}.npz")
        for _, path in self._versions(name)[:-KEPT_VERSIONS]:
            path.unlink(missing_ok=True)

    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob("*.npz"))


def of(msg: Message, partition_id: int) -> ClientState:
    """The state of the client ``partition_id`` in the run ``msg`` belongs to."""
    return ClientState(client_dir(root(msg), run_key(msg), partition_id))


def run_folder(msg: Message) -> Path:
    """The folder of the run ``msg`` belongs to on this machine, shared by its clients here."""
    return run_dir(root(msg), run_key(msg))


def forget_request(key: str) -> ConfigRecord:
    return ConfigRecord({FORGET: key})


def forget(msg: Message) -> bool:
    """Remove the run's client state on this machine, unless the run asked to keep it; whether
    it was removed."""
    if _kept(msg):
        return False
    shutil.rmtree(_run_path(root(msg), str(msg.content[FORGET][FORGET])), ignore_errors=True)
    return True
