"""Runs a composed config through ``flwr run`` safely (FLOWER_NOTES.md traps).

- a private SuperLink per run, started from a neutral working directory with a private
  FLWR_HOME and free loopback ports, so no other checkout's app can be imported or shared;
- runtime dependency installation off (the venv already has everything);
- the real outcome read back with ``flwr ls`` (``flwr run --stream`` exits 0 on failure);
- every process started here is stopped by process group when the run ends; SIGTERM and
  SIGINT stop the run the same way (``Interrupted``), and a watchdog (``fedsim/watchdog.py``)
  ends every process of the run when the launcher itself is killed (SIGKILL, OOM killer).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import tomli_w
from omegaconf import DictConfig

from fedsim.data import REPO_ROOT
from fedsim.watchdog import ENV_KEY

BIN = Path(sys.executable).parent
RUN_ID = re.compile(r"Successfully started run (\d+)")


class RunFailed(RuntimeError):
    """The Flower run did not complete; the message carries Flower's status and the error."""


class Interrupted(Exception):
    """SIGTERM / SIGINT stopped the run; ``exit_code`` is 143 / 130."""

    def __init__(self, exit_code: int):
        super().__init__(f"interrupted (exit {exit_code})")
        self.exit_code = exit_code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, token: str) -> dict:
    env = dict(os.environ)
    env.update({
        ENV_KEY: token,
        "FLWR_HOME": str(home),
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    })
    return env


class Process:
    """A child in its own process group, killed with its whole tree on exit."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict, log: Path):
        self.cmd, self.log = cmd, log
        self._fh = open(log, "ab")
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self._fh,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # children that outlive the leader (Ray workers) share its process group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._fh.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def _wait_healthy(port: int, proc: Process, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RunFailed(f"{proc.cmd[0]} exited with {proc.proc.returncode}; "
                            f"log: {proc.log}\n{proc.log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RunFailed(f"SuperLink not healthy after {timeout:.0f} s; log: {proc.log}")


def start_superlink(workdir: Path, env: dict, simulation: bool) -> tuple[Process, int]:
    port = free_port()
    cmd = [str(BIN / "flower-superlink"), "--insecure", "--isolation", "subprocess",
           "--host", "127.0.0.1", "--port", str(port), "--database", str(workdir / "state.db"),
           "--disable-runtime-dependency-installation"]
    proc = Process(cmd + (["--simulation"] if simulation else []), workdir, env,
                   workdir / "superlink.log")
    _wait_healthy(port, proc)
    return proc, port


def start_supernodes(workdir: Path, env: dict, superlink_port: int, count: int,
                     data_root: str) -> list[Process]:
    nodes = []
    for pid in range(count):
        node_config = f'partition-id={pid} num-partitions={count} data-root="{data_root}"'
        nodes.append(Process([str(BIN / "flower-supernode"), "--insecure", "--superlink",
                              f"127.0.0.1:{superlink_port}", "--node-config", node_config,
                              "--port", str(free_port())], workdir, env,
                             workdir / f"supernode-{pid}.log"))
    return nodes


def _flwr(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "flwr"), *args], env=env, cwd=cwd, capture_output=True,
                          text=True)


def run_status(run_id: str, env: dict, cwd: Path) -> str:
    res = _flwr(["ls", "--run-id", run_id, "--format", "json"], env, cwd)
    try:
        runs = json.loads(res.stdout)["runs"]
        return runs[0]["status"]
    except (ValueError, KeyError, IndexError) as exc:
        raise RunFailed(f"could not read the status of run {run_id}: {res.stdout}{res.stderr}") from exc


@contextmanager
def _signals_interrupt():
    """SIGTERM / SIGINT raise :class:`Interrupted`, so the ExitStack stops what was started."""
    def raise_interrupted(signum, frame):
        for sig in previous:  # a second signal must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(128 + signum)

    previous = {sig: signal.signal(sig, raise_interrupted) for sig in (signal.SIGTERM,
                                                                      signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _watchdog(stack: ExitStack, token: str, workdir: Path) -> None:
    """Start the watchdog; on the way out close its pipe and let it sweep stragglers."""
    argv = [sys.executable, "-m", "fedsim.watchdog", token, str(workdir), str(os.getpid())]
    dog = subprocess.Popen(argv,
                           stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True,
                           cwd=str(REPO_ROOT))

    def release():
        dog.stdin.close()
        try:
            dog.wait(30)
        except subprocess.TimeoutExpired:
            dog.kill()
    stack.callback(release)


def _stream(cmd: list[str], workdir: Path, env: dict, echo) -> tuple[int, str | None]:
    """Run ``flwr run --stream`` in its own process group, echo its output, return its exit
    code and the run id; its group is killed if we leave early (an interrupt)."""
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True)
    run_id = None
    try:
        for line in proc.stdout:
            echo(line.rstrip("\n"))
            if run_id is None and (m := RUN_ID.search(line)):
                run_id = m.group(1)
        return proc.wait(), run_id
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        proc.stdout.close()


def launch(cfg: DictConfig, overrides: list[str], num_supernodes: int, echo=print) -> dict:
    """Run ``overrides`` through Flower on the backend of ``cfg.hardware``; return the status."""
    hw = cfg.hardware
    simulation = hw.backend == "simulation"
    if hw.backend not in ("simulation", "deployment"):
        raise RunFailed(f"hardware.backend must be simulation or deployment, got {hw.backend!r}")
    results_dir = Path(cfg.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="fedsim-run-"))
    home = workdir / "flwr_home"
    home.mkdir()
    token = uuid.uuid4().hex  # fresh per run: two runs never share one (and never end each other)
    env = _env(home, token)
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        _watchdog(stack, token, workdir)
        stack.enter_context(_signals_interrupt())
        if simulation or hw.launch_local:
            link, port = start_superlink(workdir, env, simulation)
            stack.enter_context(link)
            address = f"127.0.0.1:{port}"
            if not simulation:
                for node in start_supernodes(workdir, env, port, num_supernodes, cfg.data_root):
                    stack.enter_context(node)
        else:
            address = str(hw.superlink)
        (home / "config.toml").write_text(tomli_w.dumps({"superlink": {
            "default": "fedsim", "fedsim": {"address": address, "insecure": True}}}))
        run_config = workdir / "run_config.toml"
        run_config.write_text(tomli_w.dumps({"overrides": shlex.join(overrides)}))
        cmd = [str(BIN / "flwr"), "run", str(REPO_ROOT), "fedsim", "--stream",
               "--run-config", str(run_config)]
        if simulation:
            cmd += ["--federation-config",
                    f"num-supernodes={num_supernodes} client-resources-num-cpus={int(hw.client_cpus)} "
                    f"client-resources-num-gpus={float(hw.client_gpus)} "
                    f"init-args-num-cpus={int(hw.num_cpus)}"]
        echo(f"fedsim: {num_supernodes} SuperNodes, {hw.backend} via SuperLink {address}; "
             f"results -> {results_dir}")
        code, run_id = _stream(cmd, workdir, env, echo)
        if code != 0 or run_id is None:
            raise RunFailed(f"`flwr run` could not start the run (exit {code})")
        status = run_status(run_id, env, workdir)
        error = results_dir / "error.txt"
        if status != "finished:completed" or error.exists():
            detail = error.read_text() if error.exists() else "(no error.txt; see the log above)"
            raise RunFailed(f"Flower run {run_id} ended as {status}.\n{detail}")
        if (simulation or hw.launch_local) and not (results_dir / "results.json").exists():
            raise RunFailed(f"run {run_id} completed but wrote no results.json in {results_dir}")
        return {"run_id": run_id, "status": status, "results_dir": str(results_dir)}


