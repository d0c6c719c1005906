"""``flwr`` whose FAB build does not walk the folders Flower's own rules drop whole.

    python -m fedsim.run.flwr_run ARGS      # = flwr ARGS

Flower 1.42 builds a ``flwr run``'s FAB by listing every file under the app's folder and
resolving each one (flwr/cli/utils.py, ``collect_files``) before its publish rules drop
``.venv/**``, ``.flwr/**`` and ``**/__pycache__/**`` (flwr/supercore/constant.py,
``APP_PUBLISH_EXCLUDE_PATTERNS``). A checkout set up as the README says holds its environment in
``.venv``: 69,000 of its 70,000 files, 8-10 s of every run here. :func:`collect_files` is
Flower's walk that does not enter those folders: the same FAB, byte for byte
(``fedsim/run/test_flwr_run.py``). Hand-written: Flower has no setting for its walk.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fedsim.flower.cli import fab_build, flwr_cli

DROPPED_AT_TOP = (".venv", ".flwr")  # Flower's ".venv/**" and ".flwr/**": the app folder's own
DROPPED_ANYWHERE = "__pycache__"  # Flower's "**/__pycache__/**"


def _dropped(folder: Path) -> bool:
    """Whether Flower drops every file under ``folder`` (relative to the app's root)."""
    return folder.name == DROPPED_ANYWHERE or (
        len(folder.parts) == 1 and folder.name in DROPPED_AT_TOP
    )


def collect_files(root: Path) -> dict[str, Path]:
    """Flower's ``collect_files`` (relative POSIX path -> path; symlinked files skipped, symlinked
    folders not entered, nothing that resolves outside ``root``), without entering the folders
    whose files Flower drops."""
    resolved_root = root.resolve()
    files: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if not _dropped((here / d).relative_to(root))]
        for filename in filenames:
            path = here / filename
            if path.is_symlink() or not path.resolve().is_relative_to(resolved_root):
                continue
            files[path.relative_to(root).as_posix()] = path
    return files


def main() -> None:
    fab_build.collect_files = collect_files
    sys.argv[0] = "flwr"
    flwr_cli()


if __name__ == "__main__":
    main()
