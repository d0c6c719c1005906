"""Installing fedsim claims no generic top-level name, and a SuperNode runs the FAB's own code.

fedsim's layers are the top-level packages ``fedsim_experiments``, ``fedsim_clients``,
``fedsim_strategies`` and ``fedsim_tasks``, not ``fedsim.tasks`` and its siblings mapped in at
install time (setuptools ``package-dir``): a SuperNode runs the FAB, which Flower builds from the
project's folders as they lie on disk and loads with its unpacked folder first on ``sys.path``,
so the FAB's ``fedsim/`` hides the installed one and holds no ``tasks``. Each check runs in a
fresh interpreter, as Flower's SuperNode and ``fedsim run`` do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedsim.config.data import REPO_ROOT
from fedsim.flower.cli import build_fab_from_disk, install_from_fab

GENERIC = ("tasks", "clients", "strategies", "experiments")

# Loads both Flower components the way a SuperNode loads the FAB (flwr.supercore.object_ref's
# load_app, which puts the app folder first on sys.path) or, without an app folder, the way
# `fedsim run` imports them; then finds every module conf/ names and what `tasks` is.
PROBE = """
import importlib.util, json, re, sys
from pathlib import Path
from flwr.supercore.object_ref import load_app
app_dir = sys.argv[1] or None
for component in ("fedsim.runtime.client_app:app", "fedsim.runtime.server_app:app"):
    load_app(component, RuntimeError, app_dir) if app_dir else __import__(component.split(":")[0])
conf = Path(sys.modules["fedsim"].__file__).parents[1] / "conf"
names = {m.rsplit(".", 1)[0] for f in conf.rglob("*.yaml")
         for m in re.findall(r"\\bfedsim_\\w+(?:\\.\\w+)+", f.read_text())}
import tasks
print(json.dumps({"tasks": tasks.__file__, "fedsim": sys.modules["fedsim"].__file__,
                  "modules": {n: importlib.util.find_spec(n).origin for n in sorted(names)}}))
"""


def _run(code: str, *args: str, cwd: Path, path: list[Path]) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, path)),
        "FLWR_TELEMETRY_ENABLED": "0",
    }
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def user_packages(tmp_path) -> Path:
    """A user's own top-level ``tasks``, ``clients``, ``strategies`` and ``experiments``."""
    root = tmp_path / "user"
    for name in GENERIC:
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(f'"""The user\'s own {name}."""\n')
    return root


def _probe(app_dir: Path | None, user: Path) -> dict:
    res = _run(PROBE, str(app_dir or ""), cwd=user, path=[user])
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _assert_fedsim_from(found: dict, root: Path, user: Path) -> None:
    assert Path(found["tasks"]).is_relative_to(user)
    assert Path(found["fedsim"]).is_relative_to(root)
    layers = {name.split(".")[0] for name in found["modules"]}
    assert layers == {f"fedsim_{name}" for name in GENERIC}
    for name, origin in found["modules"].items():
        assert origin and Path(origin).is_relative_to(root), (name, origin)


def test_a_users_own_tasks_package_does_not_shadow_fedsim(user_packages):
    """With the user's generic packages first on the path, fedsim's components and every module
    named in conf/ still come from this checkout, and ``tasks`` stays the user's."""
    _assert_fedsim_from(_probe(None, user_packages), REPO_ROOT, user_packages)


def test_a_supernode_runs_the_fabs_own_layers(tmp_path, user_packages):
    """The FAB that `flwr run` builds from this checkout, unpacked and loaded as a SuperNode
    does: its own ``fedsim`` and layers run (not the installed ones), beside the user's ``tasks``."""
    app_dir = install_from_fab(
        build_fab_from_disk(REPO_ROOT), tmp_path / "flwr-home", skip_prompt=True
    )
    _assert_fedsim_from(_probe(app_dir, user_packages), app_dir, user_packages)


def test_layers_mapped_into_fedsim_at_install_are_missing_from_the_fab(tmp_path):
    """Why the layers are not ``fedsim.tasks``: a project that maps its ``tasks/`` folder to
    ``fedsim.tasks`` installs and imports, but its FAB, unpacked and loaded the way a SuperNode
    does, cannot import its own component: the FAB holds ``tasks/`` at the top, and its ``fedsim/``
    comes first on ``sys.path``, hiding the installed ``fedsim`` with its ``fedsim.tasks``."""
    project = tmp_path / "project"
    (project / "fedsim").mkdir(parents=True)
    (project / "tasks").mkdir()
    (project / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "mapped-probe"
        version = "0.1.0"
        [tool.setuptools]
        packages = ["fedsim", "fedsim.tasks"]
        package-dir = {"fedsim" = "fedsim", "fedsim.tasks" = "tasks"}
        [tool.flwr.app]
        publisher = "probe"
        [tool.flwr.app.components]
        serverapp = "fedsim.client_app:app"
        clientapp = "fedsim.client_app:app"
        [tool.flwr.app.config]
        overrides = ""
        """)
    )
    (project / "fedsim" / "__init__.py").write_text("")
    (project / "fedsim" / "client_app.py").write_text(
        "import fedsim.tasks\n\napp = fedsim.tasks.WHERE\n"
    )
    (project / "tasks" / "__init__.py").write_text("WHERE = __file__\n")
    site = tmp_path / "site"
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--target",
            str(site),
            str(project),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pip.returncode == 0, pip.stderr
    assert (
        site / "fedsim" / "tasks" / "__init__.py"
    ).is_file()  # installed under fedsim's namespace

    installed = _run("import fedsim.client_app as c; print(c.app)", cwd=tmp_path, path=[site])
    assert installed.returncode == 0 and Path(installed.stdout.strip()).is_relative_to(site), (
        installed.stderr
    )

    app_dir = install_from_fab(
        build_fab_from_disk(project), tmp_path / "flwr-home", skip_prompt=True
    )
    assert (app_dir / "tasks" / "__init__.py").is_file() and not (
        app_dir / "fedsim" / "tasks"
    ).exists()
    loaded = _run(
        "import sys\nfrom flwr.supercore.object_ref import load_app\n"
        "load_app('fedsim.client_app:app', RuntimeError, sys.argv[1])",
        str(app_dir),
        cwd=tmp_path,
        path=[site],
    )
    assert loaded.returncode != 0
    assert "No module named 'fedsim.tasks'" in loaded.stderr
