"""Data-root resolution and file checks shared by every task.

Order of precedence: an explicit setting (the server's config ``data_root``, or a client node's
``data-root``: a client never reads the server's, ``fedsim/config/node_local.py``), then the
``FEDSIM_DATA_ROOT`` environment variable, then
``../shared/data`` beside the checkout, then beside the working directory (under ``flwr run .``
the app runs from Flower's installed copy, and the working directory is the checkout). A task
whose YAML sets ``data_root: null`` reads no data: no root is looked for (:func:`reads_data`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

ENV_VAR = "FEDSIM_DATA_ROOT"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DATA_ROOTS = (REPO_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data")


class DataNotFoundError(FileNotFoundError):
    """A data file is missing; the message names the path and the upstream source."""


def reads_data(task: DictConfig) -> bool:
    """False for a task whose YAML sets ``data_root: null`` itself (not ``${data_root}``): it
    reads no data, so no data root is looked for, by the run or by its clients."""
    return OmegaConf.is_interpolation(task, "data_root") or task.get("data_root") is not None


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """Return the absolute data root; a root that is named but missing is an error."""
    for source, value in (("data_root", explicit), (f"${ENV_VAR}", os.environ.get(ENV_VAR))):
        if value not in (None, ""):
            path = Path(value).expanduser().resolve()
            if not path.is_dir():
                raise DataNotFoundError(
                    f"No data root found: {source} points to {path}, which is not a folder."
                )
            return path
    for default in DEFAULT_DATA_ROOTS:
        if default.is_dir():
            return default.resolve()
    raise DataNotFoundError(
        f"No data root found: data_root is unset, ${ENV_VAR} is unset and none of the defaults "
        f"{', '.join(map(str, DEFAULT_DATA_ROOTS))} exists. Set data_root=/path or export "
        f"{ENV_VAR}=/path."
    )


def require_file(path: Path, upstream: str) -> Path:
    """Return ``path`` if it exists, else raise naming the path and where it comes from."""
    if not path.is_file():
        raise DataNotFoundError(
            f"Missing data file: {path}. It comes from {upstream}; put the upstream "
            f"files under the data root (see ../shared/data/README.md for the layout)."
        )
    return path


def who_else_writes(path: Path) -> str | None:
    """Why another local user could plant links in ``path`` or swap what is written there (None:
    no one but this user and root can): the nearest existing folder on the way and the first one
    of its ancestors owned by another user, or writable by others without the sticky bit (as
    /tmp has it, where each entry stays its owner's). What OpenSSH's StrictModes checks; no
    library offers it."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    for folder in reversed((existing, *existing.parents)):
        info = folder.stat()
        if info.st_uid not in (0, os.getuid()):
            return f"{folder} belongs to uid {info.st_uid}"
        if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
            return f"{folder} is writable by others ({stat.filemode(info.st_mode)})"
    return None
