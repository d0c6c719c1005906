"""Static checks in the test command: the one-way layers (import-linter contracts in
pyproject.toml) and ruff."""

import ast
import re
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_layers_import_one_way():
    res = _run(str(BIN / "lint-imports"), "--no-cache")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout


def test_ruff():
    res = _run(str(BIN / "ruff"), "check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_tree_is_formatted():
    """One width for code (100 columns, near Flower's), kept by the formatter, not by hand."""
    res = _run(str(BIN / "ruff"), "format", "--check", ".")
    assert res.returncode == 0, res.stdout + res.stderr


def test_tests_run_in_a_private_home():
    home = Path.home()  # set by the repository's root conftest.py
    assert home.name.startswith("fedsim-test-home-")
    assert Path("~/.cache").expanduser().is_relative_to(home)


SOURCES = (
    "fedsim",
    "fedsim_clients",
    "fedsim_strategies",
    "fedsim_tasks",
    "fedsim_experiments",
    "bench",
)
RECORDS = {"RecordDict", "ConfigRecord", "MetricRecord", "ArrayRecord"}
READ_FROM = (
    "content",
    "record",
    "config",
)  # what a message key is read from: a message's records and config


def _is_record(node: ast.AST) -> bool:
    return any(word in ast.unparse(node) for word in READ_FROM)


def _message_literals(tree: ast.AST, keys: set[str]):
    """The string constants of ``keys`` a module writes where a message key goes: anywhere for a
    key no other config uses ("num-examples"), else in a record built (``ConfigRecord({...})``) or
    read (``content["config"]``, ``config.get("seed")``, ``"seed" in record``), or a name given it."""

    def literal(node):
        return node.value if isinstance(node, ast.Constant) and node.value in keys else None

    for node in ast.walk(tree):
        found = []
        if isinstance(node, ast.Constant) and "-" in str(node.value):
            found = [literal(node)]
        elif isinstance(node, ast.Assign):
            found = [literal(node.value)]
        elif isinstance(
            node, ast.FunctionDef
        ):  # a record's name as a default: model_reply(arrays="arrays")
            found = [
                literal(d) for d in node.args.defaults + node.args.kw_defaults if d is not None
            ]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) in RECORDS
        ):
            found = [
                literal(k)
                for a in node.args
                if isinstance(a, ast.Dict)
                for k in a.keys
                if k is not None
            ]
        elif isinstance(node, ast.Subscript) and _is_record(node.value):
            found = [literal(node.slice)]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "get"
            and _is_record(node.func.value)
        ):
            found = [literal(a) for a in node.args[:1]]
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.ops[0], ast.In)
            and _is_record(node.comparators[0])
        ):
            found = [literal(node.left)]
        yield from ((node.lineno, k) for k in found if k is not None)


def test_message_keys_are_declared_once():
    """Every key in fedsim/message_keys.py is written there only: everywhere else it is imported,
    so the sender and the reader of a message cannot spell it two ways."""
    from fedsim import message_keys

    keys = {v for k, v in vars(message_keys).items() if k.isupper()}
    declaring = REPO / "fedsim" / "message_keys.py"
    restated = [
        f"{path.relative_to(REPO)}:{line}: {key!r}"
        for package in SOURCES
        for path in sorted((REPO / package).rglob("*.py"))
        if path != declaring and not path.name.startswith(("test_", "conftest"))
        for line, key in sorted(set(_message_literals(ast.parse(path.read_text()), keys)))
    ]
    assert not restated, "message keys restated outside fedsim/message_keys.py:\n" + "\n".join(
        restated
    )


PYTHON_BLOCK = re.compile(
    r"^```python[^\n]*\n(.*?)^```$", re.S | re.M
)  # a page's Python, as the walkthrough's


def _python_sources():
    """(where, first line, code) of every Python module of the packages, tests and bench, and
    every Python block of the Markdown pages (the walkthrough's files live there), message_keys.py
    left out."""
    declaring = REPO / "fedsim" / "message_keys.py"
    modules = [
        p
        for folder in (*SOURCES, "tests")
        for p in sorted((REPO / folder).rglob("*.py"))
        if p != declaring
    ]
    for path in modules:
        yield str(path.relative_to(REPO)), 0, path.read_text()
    for page in sorted([*REPO.glob("*.md"), *(REPO / "docs").rglob("*.md")]):
        text = page.read_text()
        for block in PYTHON_BLOCK.finditer(text):
            yield str(page.relative_to(REPO)), text[: block.start(1)].count("\n"), block.group(1)


def _key_assignments(tree: ast.AST, shared: dict[str, str]):
    """(line, name, value) of each string assigned to a shared key's value (a second declaration
    of it, under any name) or to a shared key's name (a second spelling of it)."""
    for node in ast.walk(tree):
        value = getattr(node, "value", None)
        if (
            not isinstance(node, (ast.Assign, ast.AnnAssign))
            or not isinstance(value, ast.Constant)
            or not isinstance(value.value, str)
        ):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for name in [t.id for t in targets if isinstance(t, ast.Name)]:
            keylike = re.fullmatch(r"[\w-]+", value.value)  # a key, not a text that shares a name
            if value.value in shared.values() or (name in shared and keylike):
                yield node.lineno, name, value.value


def test_no_module_or_page_redeclares_a_shared_message_key():
    """A key of fedsim/message_keys.py is assigned there only: every module, test, bench script
    and page's code block (the walkthrough's toy) imports it, so no method restates it."""
    from fedsim import message_keys

    shared = {k: v for k, v in vars(message_keys).items() if k.isupper() and isinstance(v, str)}
    found = [
        f"{where}:{first + line}: {name} = {value!r}"
        for where, first, code in _python_sources()
        for line, name, value in _key_assignments(ast.parse(code, where), shared)
    ]
    assert not found, "shared message keys declared outside fedsim/message_keys.py:\n" + "\n".join(
        found
    )
