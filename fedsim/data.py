"""Data-root resolution and file checks shared by every task.

Order of precedence: an explicit setting (config ``data_root`` or a node's
``data-root``), then the ``FEDSIM_DATA_ROOT`` environment variable, then
``../shared/data`` beside the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "FEDSIM_DATA_ROOT"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_ROOT = REPO_ROOT.parent / "shared" / "data"


class DataNotFoundError(FileNotFoundError):
    """A data file is missing; the message names the path and the upstream source."""


def resolve_data_root(explicit: str | os.PathLike | None = None) -> Path:
    """Return the absolute data root, or raise with every place that was tried."""
    tried = []
    for source, value in (
        ("config data_root", explicit),
        (f"${ENV_VAR}", os.environ.get(ENV_VAR)),
        ("default", DEFAULT_DATA_ROOT),
    ):
        if value in (None, ""):
            continue
        path = Path(value).expanduser().resolve()
        if path.is_dir():
            return path
        tried.append(f"{source}: {path}")
    raise DataNotFoundError(
        "No data root found. Tried " + "; ".join(tried or ["nothing"]) + ". "
        f"Set data_root=/path on the command line or export {ENV_VAR}=/path."
    )


def require_file(path: Path, upstream: str) -> Path:
    """Return ``path`` if it exists, else raise naming the path and where it comes from."""
    if not path.is_file():
        raise DataNotFoundError(
            f"Missing data file: {path}. It comes from {upstream}; put the upstream "
            f"files under the data root (see ../shared/data/README.md for the layout)."
        )
    return path
