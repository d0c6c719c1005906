"""``fedsim.run.flwr_run``'s walk gives Flower's FAB byte for byte without entering what Flower
drops whole, and the checkout's FAB holds the app, not the records."""

import os
import subprocess
import sys
import textwrap
import zipfile
from io import BytesIO
from pathlib import Path

from fedsim.config.compose import REPO_ROOT
from fedsim.flower.cli import build_fab_from_disk, collect_files, fab_build
from fedsim.run import flwr_run

PYPROJECT = textwrap.dedent("""\
    [project]
    name = "walk-probe"
    version = "0.1.0"
    [tool.flwr.app]
    publisher = "probe"
    [tool.flwr.app.components]
    serverapp = "app.main:app"
    clientapp = "app.main:app"
    """)


def _project(root: Path) -> Path:
    """An app beside every kind of folder and file the walk must treat as Flower does."""
    files = {
        "pyproject.toml": PYPROJECT,
        "app/__init__.py": "",
        "app/main.py": "app = None\n",
        "app/__pycache__/main.cpython-311.py": "# dropped\n",
        "app/.venv/kept.py": "# not the top-level .venv: Flower keeps it\n",
        "app/.flwr/kept.py": "# nor this .flwr\n",
        "app/conf/run.yaml": "a: 1\n",
        ".venv/lib/site.py": "# dropped\n",
        ".venv/pyvenv.cfg": "home = /usr\n",
        ".flwr/config.toml": "# dropped\n",
        "outside.py": "# the target of a symlink: Flower skips the link\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "app" / "link.py").symlink_to(root / "outside.py")
    (root / "linked").symlink_to(root / "app", target_is_directory=True)
    return root


def test_the_pruned_walk_builds_flowers_fab_byte_for_byte(tmp_path, monkeypatch):
    project = _project(tmp_path)
    flowers = build_fab_from_disk(project)
    monkeypatch.setattr(fab_build, "collect_files", flwr_run.collect_files)
    assert build_fab_from_disk(project) == flowers
    names = zipfile.ZipFile(BytesIO(flowers)).namelist()
    assert "app/.venv/kept.py" in names and "app/main.py" in names and "app/link.py" not in names
    walked, pruned = set(collect_files(project)), set(flwr_run.collect_files(project))
    assert walked - pruned == {
        ".venv/lib/site.py",
        ".venv/pyvenv.cfg",
        ".flwr/config.toml",
        "app/__pycache__/main.cpython-311.py",
    }
    assert pruned < walked


def test_the_checkouts_fab_holds_the_app_and_no_records():
    """Flower refuses a FAB over 10 MB; records/ alone was 7 MB of it (pyproject's fab-exclude)."""
    fab = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from fedsim.flower.cli import fab_build;"
            "from fedsim.run.flwr_run import collect_files; fab_build.collect_files = collect_files;"
            "sys.stdout.buffer.write(fab_build.build_fab_from_disk(Path(sys.argv[1])))",
            str(REPO_ROOT),
        ],
        capture_output=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    ).stdout
    names = zipfile.ZipFile(BytesIO(fab)).namelist()
    tops = {name.split("/")[0] for name in names if "/" in name}
    assert {"fedsim", "fedsim_clients", "fedsim_strategies", "fedsim_tasks", "conf"} <= tops
    assert not tops & {"records", "docs", "bench", "tests", ".venv"}, tops
    assert len(fab) < 3 * 1024 * 1024
