"""Checkpoint and resume by replay: every completed exchange is journaled, a resumed run replays.

Every phase of every protocol goes through :meth:`fedsim.runtime.messaging.Messenger.exchange`, so the
clients' side of a run is exactly the sequence of its exchanges' usable replies. After each
exchange (a round's training, a regroup's loss reports, an HE chunk, ...) the Messenger appends
its replies, fault counts and traffic here, as one file written then renamed (a kill never
leaves a half-written entry). ``fedsim run resume=<results_dir>`` runs the same protocol code
with the same seed: the first exchanges are answered from the journal, in order, without
sending anything, which rebuilds every piece of server state (global models, FedBiscuit's
selectors and groups, DPMean's privacy accountant, FedDTRE's schedule, the sampling RNG, the
round metrics and fault counts) exactly as they were; then the run goes on live from the first
exchange that had not completed. Server-side computation between exchanges is redone; client
work is not.

Node ids are new in every Flower run, so the journal keeps each node's partition id; a resumed
run asks every node for its partition (``WHOAMI``) and translates ids both ways, the protocol
living in the first run's ids throughout.

An entry is a sealed JSON header followed by the replies in Flower's own wire format (protobuf),
never a pickle: reading it runs no code. The header is authenticated with an HMAC under a key
derived from the run's secret (``fedsim/privacy/secret.py``) and bound to the file's name, and it
holds the replies' sizes and their SHA-256, so a planted, altered, renamed or reordered entry is
refused on resume (:class:`JournalTampered`) instead of steering the resumed server. (The replies
were once base64 inside the sealed JSON: 4.9 s per 1,000 replies of a 33,000-weight model,
against 0.35 s to serialize them, and most of fedsim's overhead over plain Flower per round.)

Length and order are sealed too: each entry names the digest of the one before it (a chain), and
a sealed ``head`` holds the count and the last entry's digest, rewritten after every entry. A
journal with entries deleted (at its end too), reordered, spliced or without its head is refused:
a resumed run would send the missing exchanges again, and a redone DP round draws the same noise
(the run's secret) over replies that may differ, so the two releases together give a client's
row exactly. A kill between an entry and its head leaves one entry more than the head counts,
chained to the head's last: that journal resumes with the entry (nothing was released between
the two writes). Not detectable: the whole journal folder put back as an older copy of itself
(its head then counts its own entries), which only a record kept outside the folder could tell.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import time
from collections import Counter
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fedsim.flower.messages import ProtoMessage, message_from_proto, message_to_proto
from fedsim.message_keys import PARTITION_ID, RAY_NODE
from fedsim.privacy.secret import Tampered, open_sealed, open_sealed_bytes, private_folder, seal
from fedsim.results.outputs import write_file
from fedsim.runtime.polling import Poller

WHOAMI = "fedsim-whoami"  # the core query every ClientApp answers with its partition id
HEAD = "head"  # the journal's sealed count and last digest


NODE_KEYS_ENV = (
    "FEDSIM_NODE_KEYS"  # the partition each SuperNode key is bound to (launcher -> ServerApp)
)


def ask_partitions(
    grid, timeout: float, poll: float, placed: dict[int, int] | None = None
) -> tuple[dict[int, int], dict[str, int], dict[str, int]]:
    """Every node's partition id (node id -> partition), asked with ``WHOAMI``, the counts of the
    ``whoami`` phase, and the accepted replies per Ray node (``RAY_NODE``; none outside a
    simulation): the Messenger maps node ids across a resume and lists nodes in partition order,
    the ShardedGrid places logical clients, the results' provenance names the Ray nodes. A node
    that fails or does not answer in time, or names no whole partition in [0, nodes), is left
    out; so is every node of a partition that several claim (``duplicate``): a node that claims
    another's partition never takes its place. Where the server ``placed`` each node's partition
    (a ShardedGrid's logical clients) or the launcher bound each partition to a SuperNode key
    (:func:`key_partitions`), a node claiming another partition than its own is left out too
    (``malformed``): a partition whose holder is down stays vacant."""
    nodes, bound = list(grid.get_node_ids()), key_partitions(grid) if placed is None else placed
    pending = set(
        grid.push_messages(
            [
                Message(
                    RecordDict({WHOAMI: ConfigRecord()}),
                    dst_node_id=n,
                    message_type=MessageType.QUERY,
                )
                for n in nodes
            ]
        )
    )
    claims, counts, start = {}, {"sent": len(nodes), "failed": 0, "malformed": 0}, time.monotonic()
    ray_nodes = Counter()
    poller = Poller(poll)
    while pending and time.monotonic() - start < timeout:
        for reply in poller.pull(grid.pull_messages, pending):
            pending.discard(reply.metadata.reply_to_message_id)
            if reply.has_error():
                counts["failed"] += 1
            elif (partition := _partition(reply.content, len(nodes))) is None:
                counts["malformed"] += 1
            elif bound is not None and bound.get(reply.metadata.src_node_id) != partition:
                counts["malformed"] += 1
                logging.getLogger("fedsim").warning(
                    "whoami: node %d claims partition %d, bound to %s",
                    reply.metadata.src_node_id,
                    partition,
                    "none"
                    if bound.get(reply.metadata.src_node_id) is None
                    else f"partition {bound[reply.metadata.src_node_id]}",
                )
            else:
                claims[reply.metadata.src_node_id] = partition
                ray_nodes[_ray_node(reply.content)] += 1
        if pending:
            poller.pause()
    claimed = Counter(claims.values())
    partitions = {n: p for n, p in claims.items() if claimed[p] == 1}
    counts |= {
        "duplicate": len(claims) - len(partitions),
        "timed_out": len(pending),
        "accepted": len(partitions),
    }
    log = logging.getLogger("fedsim")
    log.info(
        "[whoami] %d/%d nodes told their partition in %.1f s",
        len(partitions),
        len(nodes),
        time.monotonic() - start,
    )
    if len(partitions) < len(nodes):
        log.warning(
            "whoami: nodes left out of the federation: %s (taken partitions refused: %s)",
            counts,
            sorted(p for p, k in claimed.items() if k > 1),
        )
    return partitions, counts, {node: n for node, n in sorted(ray_nodes.items()) if node}


def key_fingerprint(public_key: bytes) -> str:
    """A public key's SHA-256 over its DER form, from PEM (as Flower's SuperLink holds a node's
    key: ``NodeInfo.public_key``) or OpenSSH (as ``node-I.pub`` is written)."""
    load = (
        serialization.load_pem_public_key
        if public_key.startswith(b"-----")
        else serialization.load_ssh_public_key
    )
    der = load(public_key).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def key_partitions(grid) -> dict[int, int] | None:
    """Node id -> the partition the launcher bound its key to (:data:`NODE_KEYS_ENV`, set where it
    starts the SuperNodes under SuperNode authentication; the key each node holds is the one the
    SuperLink authenticated it by: Flower's ``GetNodes``); a node of a key it made for no
    SuperNode is absent. None where no binding holds (simulation, a remote SuperLink, the logical
    clients of a ShardedGrid, whose SuperNodes were bound)."""
    nodes = list(grid.get_nodes()) if NODE_KEYS_ENV in os.environ else []
    if not any(node.public_key for node in nodes):  # no binding, or a ShardedGrid's logical clients
        return None
    by_key = json.loads(os.environ[NODE_KEYS_ENV])
    bound = {node.node_id: _bound(by_key, node.public_key) for node in nodes}
    logging.getLogger("fedsim").info("[whoami] partitions bound to the SuperNodes' keys")
    return {node: partition for node, partition in bound.items() if partition is not None}


def _bound(by_key: dict[str, int], public_key: bytes) -> int | None:
    try:
        return by_key.get(key_fingerprint(public_key))
    except (ValueError, UnsupportedAlgorithm):  # no key the SuperLink could have authenticated
        return None


def _ray_node(content: RecordDict) -> str:
    """The Ray node id a WHOAMI reply names (hex, as Ray writes it), else ""."""
    value = content.config_records[WHOAMI].get(RAY_NODE)
    return value if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{1,64}", value) else ""


def _partition(content: RecordDict, nodes: int) -> int | None:
    """The partition a WHOAMI reply names: a whole number in [0, nodes), else None."""
    record = content.config_records.get(WHOAMI)
    value = None if record is None else record.get(PARTITION_ID)
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < nodes
    return value if ok else None


class ResumeMismatch(RuntimeError):
    """The resumed run asked for another exchange than the journaled run did at that point."""


class JournalTampered(ResumeMismatch):
    """A journal file was not written by this run (planted, altered, renamed): refused."""


def _open_sealed(key: bytes, path: Path) -> dict:
    try:
        return open_sealed(key, path)
    except Tampered as exc:
        raise JournalTampered(f"{exc}; refusing to resume from it") from exc


def _entry(key: bytes, name: str, header: dict, replies: list[bytes]) -> tuple[bytes, bytes]:
    """An entry file's bytes, and its sealed header (what the chain's digest covers: it commits
    to the replies through their hash): the header's length (8 bytes), the header, the replies."""
    payload = b"".join(replies)
    sealed = seal(
        key,
        name,
        {
            **header,
            "sizes": [len(r) for r in replies],
            "sha256": hashlib.sha256(payload).hexdigest(),
        },
    )
    return len(sealed).to_bytes(8, "big") + sealed + payload, sealed


def open_entry(key: bytes, path: Path) -> tuple[dict, list[bytes], bytes]:
    """An entry's header, its replies (Flower's wire format) and its sealed header;
    :class:`JournalTampered` unless the header's MAC and the replies' hash hold."""
    try:
        data = path.read_bytes()
        size = int.from_bytes(data[:8], "big")
        sealed, payload = data[8 : 8 + size], data[8 + size :]
        header = open_sealed_bytes(key, path.name, sealed)
        sizes = header["sizes"]
        if hashlib.sha256(payload).hexdigest() == header["sha256"] and sum(sizes) == len(payload):
            bounds = [0, *itertools.accumulate(sizes)]
            return header, [payload[a:b] for a, b in zip(bounds, bounds[1:])], sealed
    except (Tampered, OSError, KeyError, TypeError, ValueError):
        pass
    raise JournalTampered(
        f"{path}: unreadable or not authenticated by this run's key; refusing to resume"
    )


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Journal:
    """The exchanges of one run, in order, under ``folder``; those already there are replayed.
    ``key`` authenticates every file (a key derived from the run's secret)."""

    def __init__(self, folder: str | Path, resume: bool, key: bytes, experiment: str = ""):
        """``experiment``: the digest of the run's experiment (``fedsim.config.compose.experiment_digest``),
        sealed in the head; a resume under another is refused."""
        self.folder, self.key, self.experiment = private_folder(Path(folder)), key, experiment
        if resume:
            self.recorded, self._last = self._verified()
        else:
            for path in self.folder.iterdir():
                path.unlink()
            self.recorded, self._last = [], ""
            self._write_head()
        self.position = 0
        self.resumed_from = len(self.recorded)  # exchanges the resumed run replays

    @staticmethod
    def begun(folder: str | Path) -> bool:
        """Whether a killed run's journal has its head (its ServerApp got that far: otherwise
        nothing was sent, and the run starts again from its beginning); entries without a head
        are refused."""
        folder = Path(folder)
        if (folder / HEAD).is_file():
            return True
        if any(folder.glob("*.exchange")):
            raise JournalTampered(
                f"{folder}: journal entries without their {HEAD}; refusing to resume"
            )
        return False

    def _verified(self) -> tuple[list[Path], str]:
        """The journaled entries and the last one's digest, once the head and the chain hold:
        names 0..n-1 without a gap, n the head's count (or one more: killed before the head was
        rewritten), each entry naming its predecessor's digest, the head's last on its entry."""
        if not (self.folder / HEAD).is_file():
            raise JournalTampered(
                f"{self.folder}: the journal's {HEAD} is missing; refusing to resume"
            )
        head = _open_sealed(self.key, self.folder / HEAD)
        if head.get("experiment", "") != self.experiment:
            raise ResumeMismatch(
                f"{self.folder}: the journaled run's experiment settings differ from this run's "
                "(only hardware, round_timeout, data_root and logging may change on resume); "
                "refusing to resume"
            )
        entries = sorted(self.folder.glob("*.exchange"))
        if [p.name for p in entries] != [f"{i:07d}.exchange" for i in range(len(entries))] or len(
            entries
        ) not in (head["count"], head["count"] + 1):
            raise JournalTampered(
                f"{self.folder}: {len(entries)} entries ({[p.name for p in entries][:3]}...) "
                f"where the {HEAD} counts {head['count']}: entries were removed or "
                "added; refusing to resume"
            )
        last = ""
        for index, path in enumerate(entries):
            header, _, sealed = open_entry(self.key, path)
            if header.get("previous") != last or (
                index + 1 == head["count"] and _digest(sealed) != head["last"]
            ):
                raise JournalTampered(
                    f"{path}: not the entry that followed the one before it; refusing to resume"
                )
            last = _digest(sealed)
        if head["count"] == 0 and head["last"]:
            raise JournalTampered(
                f"{self.folder}: the {HEAD} is not this journal's; refusing to resume"
            )
        return entries, last

    def _write_head(self) -> None:
        """After each entry: a kill before this leaves the entry, which a resume accepts."""
        write_file(
            self.folder / HEAD,
            seal(
                self.key,
                HEAD,
                {"count": len(self.recorded), "last": self._last, "experiment": self.experiment},
            ),
        )

    @property
    def replaying(self) -> bool:
        return self.position < len(self.recorded)

    def replay(self, phase: str, server_round: int) -> dict:
        """The next journaled exchange; it must be the one the protocol asks for."""
        entry, replies, _ = open_entry(self.key, self.recorded[self.position])
        if (entry["phase"], entry["round"]) != (phase, server_round):
            raise ResumeMismatch(
                f"exchange {self.position}: the journal holds {entry['phase']} "
                f"round {entry['round']}, the resumed run asks for {phase} round "
                f"{server_round} (was the code or the config changed?)"
            )
        self.position += 1
        entry["replies"] = [message_from_proto(ProtoMessage.FromString(b)) for b in replies]
        entry["faults"], entry["traffic"] = entry["counts"]
        return entry

    def record(
        self, phase: str, server_round: int, replies: list[Message], faults: dict, traffic: dict
    ) -> None:
        header = {
            "phase": phase,
            "round": server_round,
            "counts": [faults, traffic],
            "previous": self._last,
        }
        index = len(self.recorded)
        path = self.folder / f"{index:07d}.exchange"
        data, sealed = _entry(
            self.key, path.name, header, [message_to_proto(m).SerializeToString() for m in replies]
        )
        write_file(path, data)
        self.recorded.append(path)
        self.position, self._last = index + 1, _digest(sealed)
        self._write_head()

    @property
    def partitions_path(self) -> Path:
        return self.folder / "partitions.json"

    def save_partitions(self, partitions: dict[int, int]) -> None:
        """node id -> partition id of the journaled run's nodes."""
        body = {str(k): v for k, v in partitions.items()}
        write_file(self.partitions_path, seal(self.key, self.partitions_path.name, body))

    def load_partitions(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in _open_sealed(self.key, self.partitions_path).items()}
