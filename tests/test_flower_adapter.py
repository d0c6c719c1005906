"""Flower's private modules are imported in one place, the adapter ``fedsim/flower/``, so a Flower
upgrade is a look at one folder (docs/architecture.md, Flower's private names). Public is what
Flower documents for apps: the names in the ``__all__`` of ``flwr.app``, ``flwr.serverapp``,
``flwr.serverapp.strategy``, ``flwr.clientapp``, ``flwr.clientapp.mod``, ``flwr.simulation`` and
``flwr.common``."""

import ast
import importlib
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADAPTER = Path("fedsim/flower")
PUBLIC = (
    "flwr.app",
    "flwr.serverapp",
    "flwr.serverapp.strategy",
    "flwr.clientapp",
    "flwr.clientapp.mod",
    "flwr.simulation",
    "flwr.common",
)


def _is_flower(module: str) -> bool:
    return module == "flwr" or module.startswith("flwr.")


def flower_imports(tree: ast.AST):
    """``(line, module, names)`` of each Flower import in ``tree``; ``names`` is None for ``import M``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name, None) for a in node.names if _is_flower(a.name))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module == "flwr":
            yield from ((node.lineno, f"flwr.{a.name}", None) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_flower(node.module or ""):
            yield node.lineno, node.module, [a.name for a in node.names]


def private_names(module: str, names: list[str] | None) -> list[str]:
    """What of ``from module import names`` (``import module``: None) Flower does not make public."""
    if module not in PUBLIC:
        return [module] if names is None else [f"{module}.{n}" for n in names]
    public = set(importlib.import_module(module).__all__)
    return [f"{module}.{n}" for n in names or () if n not in public]


def private_imports(source: str) -> list[tuple[int, str]]:
    return [
        (line, name)
        for line, module, names in flower_imports(ast.parse(source))
        for name in private_names(module, names)
    ]


def _python_files() -> list[Path]:
    """The repository's Python files, tracked or new (not ignored): a venv or a build is not the repo's."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [Path(p) for p in out.split()]


def test_private_flower_imports_go_through_the_adapter():
    found = [
        f"{path}:{line}: {name}"
        for path in _python_files()
        if not path.is_relative_to(ADAPTER)
        if (REPO / path).exists()
        for line, name in private_imports((REPO / path).read_text())
    ]
    assert not found, (
        "Flower's private modules imported outside fedsim/flower/ (re-export them there):\n"
        + "\n".join(found)
    )


def test_the_check_tells_public_from_private():
    """Each form of import is judged: a module outside the public ones, a private name of a public
    module, a public name, a submodule imported from ``flwr``, an app's relative import."""
    source = (
        "from flwr.supercore.task_identity import TaskIdentity\n"
        "import flwr.proto.message_pb2 as pb\n"
        "from flwr.common.constant import ErrorCode\n"
        "from flwr.app.message import make_message\n"
        "from flwr.serverapp.strategy import FedAvg, strategy_utils\n"
        "from flwr import supernode, app\n"
        "from flwr.app import Message\n"
        "import flwr.serverapp\n"
        "from flwr.common import now\n"
        "from .flwr import anything\n"
    )
    assert private_imports(source) == [
        (1, "flwr.supercore.task_identity.TaskIdentity"),
        (2, "flwr.proto.message_pb2"),
        (3, "flwr.common.constant.ErrorCode"),
        (4, "flwr.app.message.make_message"),
        (5, "flwr.serverapp.strategy.strategy_utils"),
        (6, "flwr.supernode"),
    ]


def test_the_adapter_uses_private_names_only():
    """A public name needs no adapter: what ``fedsim/flower/`` re-exports is Flower's private part."""
    public = [
        f"{path}:{line}: {module}"
        for path in _python_files()
        if path.is_relative_to(ADAPTER)
        for line, module, names in flower_imports(ast.parse((REPO / path).read_text()))
        if not private_names(module, names)
    ]
    assert not public, (
        "public Flower names in the adapter (import them where they are used):\n"
        + "\n".join(public)
    )
