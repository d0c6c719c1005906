"""Where a result comes from, recorded beside it: every ``results.json`` and sweep manifest
carries ``provenance`` (the git commit and whether the checkout differed from it, the versions
of the packages that make the numbers, the command line and its overrides, the machine, start
and end times), so a page citing a result takes these from the file instead of by hand.

Two processes know different parts: the ServerApp, where the results are computed (on a remote
SuperLink's host in a deployment), records the packages, the machine and its start and end;
``fedsim run``, where the user ran it, adds the checkout's commit and the command (the ServerApp
runs from a Flower app bundle, which holds no git metadata).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import psutil

from fedsim.config.data import REPO_ROOT
from fedsim.results.outputs import write_file

PACKAGES = ("fedsim", "flwr", "torch", "transformers", "peft", "ray")
HEADING = "## Provenance"  # the summary's last section
HOST_ENV = "FEDSIM_HOST"  # the machine's name, from the fedsim run that started a local run


def now() -> str:
    """The current time, UTC, ISO 8601 to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def git_state(root: Path = REPO_ROOT) -> dict:
    """The checkout's commit, and ``dirty`` when a tracked file differs from it or an untracked,
    not-ignored file is there (either may change a result); both None outside a git checkout (an
    installed package). Through the ``git`` command: no library reads a worktree's state
    more plainly, and GitPython is only an indirect dependency here."""

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )

    try:
        head, status = git("rev-parse", "HEAD"), git("status", "--porcelain")
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    if head.returncode or status.returncode:
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def packages() -> dict[str, str | None]:
    """The installed version of each package in :data:`PACKAGES` (None: not installed)."""

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {name: version(name) for name in PACKAGES}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or None


def _gpus() -> list[str]:
    """The GPUs' names (and memory): torch's view when torch is loaded, else ``nvidia-smi``'s;
    [] without either (importing torch for this alone would cost seconds)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return (
        [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0
        else []
    )


def machine() -> dict:
    """The host: name, OS, Python, CPU model, logical and physical cores, memory, GPUs. The name is
    the one ``fedsim run`` gives (``HOST_ENV``) where it started the run on its machine: in the
    run's network namespace the host is named ``localhost`` (``fedsim/run/netns.py``)."""
    return {
        "host": os.environ.get(HOST_ENV) or platform.node(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpus": _gpus(),
    }


def environment() -> dict:
    """What the process computing a result runs on: package versions and the machine."""
    return {"packages": packages(), "machine": machine()}


def command(argv: list[str], overrides: list[str] | None = None) -> dict:
    """The command line as run, the overrides it came to (a resume's saved ones included) and
    the folder it ran in."""
    return {
        "line": shlex.join(argv),
        **({"overrides": overrides} if overrides is not None else {}),
        "cwd": os.getcwd(),
    }


def stamp(folder: str | Path, part: dict) -> dict:
    """Merge ``part`` into ``provenance`` of the run's ``results.json`` (written anew, then
    renamed) and end its ``summary.md`` with the whole provenance section (replacing the
    ServerApp's). Returns the merged provenance."""
    path = Path(folder) / "results.json"
    results = json.loads(path.read_text())
    merged = {**results.get("provenance", {}), **part}
    results["provenance"] = merged
    write_file(path, json.dumps(results, indent=2))
    summary = Path(folder) / "summary.md"
    if summary.is_file():
        head = summary.read_text().split(f"\n{HEADING}\n")[0].rstrip()
        write_file(summary, f"{head}\n\n{section(merged)}\n")
    return merged


def section(prov: dict) -> str:
    """The summary's provenance lines, from ``provenance``."""
    git, env = prov.get("git", {}), prov.get("machine", {})
    commit = git.get("commit") or "(no git checkout)"
    dirty = {True: " with uncommitted changes", False: "", None: ""}[git.get("dirty")]
    versions = ", ".join(f"{k} {v}" for k, v in prov.get("packages", {}).items() if v)
    gpus = ", ".join(env.get("gpus") or []) or "no GPU"
    lines = [
        f"- commit {commit}{dirty}",
        f"- {versions}",
        f"- {env.get('cpu_model')}, {env.get('cores')} cores, {env.get('memory_gib')} GiB, {gpus} "
        f"({env.get('host')}, Python {env.get('python')})",
        f"- {prov.get('started')} to {prov.get('ended')} (UTC)",
    ]
    if "command" in prov:
        lines.append(f"- `{prov['command']['line']}`")
    return f"{HEADING}\n\n" + "\n".join(lines)
