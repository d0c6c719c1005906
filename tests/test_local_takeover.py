"""A local process without the run's credentials cannot reach what a run listens on (issue 36).

During a real ``fedsim run`` (Ray simulation, then ``hardware=deploy_local``), this test plays
another local user: from the machine's network namespace, with a fresh FLWR_HOME and none of the
run's files, it finds every TCP port a process of the run listens on (read from /proc, in
whichever namespace) and tries each: a raw TCP connect and, where that connects, ``flwr ls``,
``flwr run <its own app>`` and the Control API's ListRuns with Flower's own HTTP client over TLS
without verifying the certificate (TLS encrypts, it does not authenticate a client). Every
attempt must be refused, and the run must complete normally. The attacker's app, were it ever
run, copies the run's journal key out. What a network namespace does not cover is checked too:
named Unix sockets (reachable through the file system) must lie in owner-only folders, the
run's work folder and Ray's session must be closed to others, ``checkpoint/`` 0700 and
``run.key`` 0600.
"""

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest
import tomli_w

from conftest import FEDSIM, SMALL, cmdline, private_tmpdir, read_results
from fedsim.flower.cli import (
    CliClientHttpInterceptor,
    ControlHttpClient,
    ListRunsRequest,
    RuntimeVersionHttpInterceptor,
)
from fedsim.run.launcher import BIN
from fedsim.run.netns import listening, socket_inodes
from fedsim.run.watchdog import run_processes

pytestmark = pytest.mark.e2e

ATTACK_APP = '''
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    Path(cfg["loot"]).write_bytes(Path(cfg["key"]).read_bytes())
'''


def _app(folder: Path, key: Path, loot: Path) -> Path:
    """The attacker's own Flower app: its ServerApp copies ``key`` to ``loot``."""
    folder.mkdir()
    (folder / "attack.py").write_text(ATTACK_APP)
    (folder / "pyproject.toml").write_text(
        tomli_w.dumps(
            {
                "build-system": {
                    "requires": ["setuptools"],
                    "build-backend": "setuptools.build_meta",
                },
                "project": {"name": "attack", "version": "1.0.0"},
                "tool": {
                    "flwr": {
                        "app": {
                            "publisher": "attacker",
                            "components": {"serverapp": "attack:app", "clientapp": "attack:app"},
                            "config": {"key": str(key), "loot": str(loot)},
                        }
                    }
                },
            }
        )
    )
    return folder


def run_listening(root: str) -> dict[tuple[str, int], str]:
    """Every TCP address a process of the run listens on, in whichever network namespace, with
    the process's pid and name."""
    found = {}
    for pid in run_processes(root):
        for address in listening(pid):
            try:
                found[address] = f"{pid} {Path(f'/proc/{pid}/comm').read_text().strip()}"
            except OSError:  # gone: its port too
                pass
    return found


def run_unix_sockets(root: str) -> dict[str, str]:
    """Every named Unix socket a process of the run listens on, with the process's pid and name:
    a network namespace keeps its abstract ones to itself, not those on the file system."""
    found = {}
    for pid in run_processes(root):
        inodes = socket_inodes(pid)
        try:
            rows = [
                line.split() for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]
            ]
        except OSError:  # gone
            continue
        # Num RefCount Protocol Flags Type St Inode Path; flag 0x10000: listening
        found |= {
            row[7]: f"{pid} {cmdline(pid)[:60]!r}"
            for row in rows
            if len(row) == 8
            and row[6] in inodes
            and int(row[3], 16) & 0x10000
            and not row[7].startswith("@")
        }
    return found


def _owner_only(path: Path, root: str) -> bool:
    """Whether a folder above ``path`` is this user's and closed to everyone else; under the
    run's TMPDIR ``root`` (the test's own), only the folders below it count: it plays the
    machine's shared temporary folder."""
    above = (
        [f for f in path.parents if Path(root) in f.parents]
        if Path(root) in path.parents
        else path.parents
    )
    return any(f.stat().st_uid == os.getuid() and not f.stat().st_mode & 0o077 for f in above)


def _target(ip: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(ip, ip)


def _connects(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((_target(ip), port), timeout=5):
            return True
    except OSError:
        return False


def _lists_runs_over_tls(ip: str, port: int) -> bool:
    """The Control API's ListRuns with Flower's client, trusting whatever certificate comes."""
    host = _target(ip)
    client = ControlHttpClient(
        f"https://{f'[{host}]' if ':' in host else host}:{port}",
        verify=False,
        timeout=10,
        interceptors=[
            CliClientHttpInterceptor(),
            RuntimeVersionHttpInterceptor(component_name="flwr CLI"),
        ],
    )
    try:
        return len(client.ListRuns(ListRunsRequest()).run_dict) > 0
    except (httpx.HTTPError, ValueError):
        return False
    finally:
        client.close()


class Attacker:
    """A second ``flwr`` client: a fresh FLWR_HOME, no certificate, none of the run's env."""

    def __init__(self, folder: Path, app: Path):
        self.home, self.app = folder / "flwr_home", app
        self.home.mkdir(parents=True)
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": str(folder),
            "FLWR_HOME": str(self.home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
        }

    def _flwr(self, ip: str, port: int, *args: str) -> subprocess.CompletedProcess:
        host = _target(ip)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        (self.home / "config.toml").write_text(
            tomli_w.dumps(
                {
                    "superlink": {
                        "default": "target",
                        "target": {"address": address, "insecure": True},
                    }
                }
            )
        )
        return subprocess.run(
            [str(BIN / "flwr"), *args],
            env=self.env,
            cwd=self.app,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def try_port(self, ip: str, port: int) -> list[str]:
        """What succeeded against ``ip:port`` (empty: every attempt was refused). A port that
        refuses a TCP connect refuses every client over TCP, so Flower's (seconds each) are tried
        only on one that accepts."""
        if not _connects(ip, port):
            return []
        won = ["TCP connect"]
        ls = self._flwr(ip, port, "ls", "--format", "json")
        if ls.returncode == 0 and '"runs"' in ls.stdout:
            won.append("flwr ls: " + " ".join(ls.stdout.split())[:160])
        run = self._flwr(ip, port, "run", str(self.app), "target")
        if "Successfully started run" in run.stdout + run.stderr:
            won.append("flwr run: started its own app")
        if _lists_runs_over_tls(ip, port):
            won.append("ListRuns over TLS")
        return won


def _files_open_to_others(root: str) -> dict[str, list[str]]:
    """The run's work folder (its Flower home, certificates, logs, Ray's session) must be closed
    to others, and Ray's session in it: Ray makes its folders 0777 under TMPDIR/ray."""
    found = {}
    for workdir in Path(root).glob("fedsim-run-*"):
        if workdir.stat().st_mode & 0o077:
            found[str(workdir)] = ["the run's work folder open to others"]
    if (Path(root) / "ray").exists():
        found[f"{root}/ray"] = ["Ray's session outside the run's work folder"]
    return found


def _wait_for(proc: subprocess.Popen, log: Path, ready, what: str) -> None:
    deadline = time.monotonic() + 300
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what}: not seen in 300 s"
        time.sleep(0.5)


def _attack_during(tmp_path: Path, overrides: list[str], ready) -> tuple[dict, str]:
    """Start ``fedsim run``, attack every port its processes listen on once ``ready(root)``,
    check those processes were alive throughout, let the run finish; returns what won and the
    run's output."""
    root, out, log = private_tmpdir(), tmp_path / "out", tmp_path / "log.txt"
    won = {}
    loot = tmp_path / "loot"
    attacker = Attacker(
        tmp_path / "attacker", _app(tmp_path / "app", out / "checkpoint" / "run.key", loot)
    )
    try:
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [FEDSIM, "run", *SMALL, f"results_dir={out}", "checkpoint.keep=true", *overrides],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TMPDIR": root},
            )
        try:
            _wait_for(proc, log, lambda: ready(root), "the run's processes were up")
            ports = run_listening(root)
            print(
                f"\n{overrides}: the run listens on", sorted(ports.items(), key=lambda p: p[0][1])
            )
            assert ports, "no listening socket of the run found: the attack would prove nothing"
            sockets = run_unix_sockets(root)
            print(f"{overrides}: its named Unix sockets", sockets)
            won |= {
                f"unix:{path} ({owner})": ["open to other users"]
                for path, owner in sockets.items()
                if not _owner_only(Path(path), root)
            }
            won |= _files_open_to_others(root)
            won |= {
                f"{ip}:{port} ({owner})": wins
                for (ip, port), owner in ports.items()
                if (wins := attacker.try_port(ip, port))
            }
            assert proc.poll() is None and all(
                psutil.pid_exists(int(o.split()[0])) for o in ports.values()
            ), "the run's processes ended during the attack: the refusals prove nothing"
            assert proc.wait(600) == 0, log.read_text()[-4000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert run_processes(root) == [], "processes left by the run"
        if loot.exists():
            won["attacker's ServerApp"] = ["copied the run's checkpoint/run.key"]
        checkpoint = out / "checkpoint"
        if (checkpoint.stat().st_mode & 0o777, (checkpoint / "run.key").stat().st_mode & 0o777) != (
            0o700,
            0o600,
        ):
            won["checkpoint/"] = ["the journal's folder or key open to others"]
        return won, log.read_text()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_no_local_client_reaches_a_simulation(tmp_path):
    won, _ = _attack_during(
        tmp_path, [], lambda root: any(b"ray::" in cmdline(pid) for pid in run_processes(root))
    )
    assert not won, "\n".join(f"{where}: {wins}" for where, wins in won.items())
    assert (tmp_path / "out" / "results.json").exists()


def test_no_local_client_reaches_a_local_deployment(tmp_path):
    def serving(root: str) -> bool:  # the ServerApp runs; the SuperLink and both SuperNodes listen
        return (
            any(b"flwr-serverapp" in cmdline(pid) for pid in run_processes(root))
            and len(run_listening(root)) >= 3
        )

    won, log = _attack_during(tmp_path, ["hardware=deploy_local", "task.max_per_split=2"], serving)
    assert not won, "\n".join(f"{where}: {wins}" for where, wins in won.items())
    assert (
        "(TLS + node authentication)" in log and read_results(tmp_path / "out")["supernodes"] == 2
    )
