"""The run's secret: 32 bytes of OS entropy from which private keys are derived.

DP noise and DP sampling must not be reproducible from anything public (the seed is in
config.yaml and results.json), yet a resumed run must draw the same noise and sample as the run
it continues: a second, different release of the same rounds would spend privacy twice. So the
secret is drawn once per run (``secrets``), kept in memory or, when the run is checkpointed, in
``checkpoint/run.key`` (created with O_EXCL and mode 0600 at once, never widened), and every use
derives its own key from it (HMAC-SHA256 with a label): the noise, the journal's authentication.
Whoever can read that file can also read the journal's raw client replies, so it adds no reader.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path

from fedsim.config.data import who_else_writes

SIZE = 32


def derive(secret: bytes, label: bytes) -> bytes:
    """An independent key for one use of the run's secret."""
    return hmac.new(secret, label, hashlib.sha256).digest()


def private_folder(path: Path) -> Path:
    """``path`` as a folder of this user's that no one else can list or enter: created 0700, and
    refused when it exists open to others (a key created there could be read or swapped)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(
            f"{path}: a private folder (keys, client state) must be a folder of this user "
            f"with mode 0700 (it is {stat.filemode(info.st_mode)}); `chmod 700 {path}` if yours"
        )
    return path


def create_private_file(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file readable by its owner only: mode 0600 from the first byte
    (no chmod window), refused if the name exists or is a symlink."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def read_private_file(path: Path, size: int | None = SIZE) -> bytes:
    """The key file's bytes, refused when it is a symlink, another user's, or readable by others
    (and, with ``size``, when it does not hold that many bytes)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise PermissionError(
                f"{path}: must be a regular file of this user with mode 0600 "
                f"(it is {stat.filemode(info.st_mode)})"
            )
        data = fh.read()
    if size is not None and len(data) != size:
        raise ValueError(f"{path}: expected a {size}-byte key, got {len(data)} bytes")
    return data


def run_secret(path: Path | None, resume: bool) -> bytes:
    """The run's secret: fresh (and, with ``path``, saved there 0600), or the saved one on resume."""
    if path is None:
        return secrets.token_bytes(SIZE)
    if resume:
        return read_private_file(path)
    private_folder(path.parent)
    path.unlink(missing_ok=True)  # a new run in an old folder: a new secret
    secret = secrets.token_bytes(SIZE)
    create_private_file(path, secret)
    return secret


def user_secret(name: str) -> bytes:
    """This user's own secret ``name`` (32 bytes of OS entropy), for a key that must not travel
    with a results folder: a 0600 file in the 0700 folder ``$XDG_STATE_HOME/fedsim`` (else
    ``~/.local/state/fedsim``, the XDG base directories' place for state kept between runs),
    made on first use. Found by hand: one environment variable, where platformdirs (the same
    path) would be a dependency of its own."""
    base = os.environ.get("XDG_STATE_HOME", "")
    folder = (Path(base) if os.path.isabs(base) else Path.home() / ".local" / "state") / "fedsim"
    if why := who_else_writes(
        folder
    ):  # they could put a folder of this user's holding a key they know in its place
        raise PermissionError(f"{folder}: {why}, so another user could swap this user's key folder")
    path = private_folder(folder) / name
    try:
        return read_private_file(path)
    except FileNotFoundError:
        draft = folder / f".{name}.{secrets.token_hex(8)}"
        create_private_file(draft, secrets.token_bytes(SIZE))
        try:
            os.link(draft, path)  # whole at once; of two first uses, the key linked first is kept
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return read_private_file(path)


class Tampered(ValueError):
    """A sealed file is unreadable or its MAC does not hold: not written under this key."""


def _mac(key: bytes, name: str, text: str) -> str:
    return hmac.new(key, f"{name}\n{text}".encode(), hashlib.sha256).hexdigest()


def seal(key: bytes, name: str, body) -> bytes:
    """``body`` as JSON with an HMAC bound to the file ``name`` it is written to (so a sealed
    file moved to another name, e.g. a journal entry reordered, no longer opens)."""
    text = json.dumps(body, sort_keys=True)
    return json.dumps({"body": text, "mac": _mac(key, name, text)}).encode()


def open_sealed(key: bytes, path: Path):
    """The body of the sealed file ``path``; :class:`Tampered` unless its MAC holds."""
    try:
        return open_sealed_bytes(key, path.name, path.read_bytes())
    except (OSError, Tampered):
        raise Tampered(f"{path}: unreadable or not authenticated by this run's key") from None


def open_sealed_bytes(key: bytes, name: str, data: bytes):
    """The body of ``data`` sealed for the file ``name``; :class:`Tampered` unless its MAC holds."""
    try:
        sealed = json.loads(data)
        text, mac = sealed["body"], sealed["mac"]
        if (
            isinstance(text, str)
            and isinstance(mac, str)
            and hmac.compare_digest(mac, _mac(key, name, text))
        ):
            return json.loads(text)
    except (ValueError, TypeError, KeyError):
        pass
    raise Tampered(f"{name}: unreadable or not authenticated by this run's key")
