"""Runs a composed config through ``flwr run`` safely (FLOWER_NOTES.md traps).

- a private SuperLink per run, started from a neutral working directory with a private
  FLWR_HOME and free loopback ports, so no other checkout's app can be imported or shared;
- a local run's processes (SuperLink, ServerApp, Ray, SuperNodes, this module's ``flwr`` calls)
  in a network namespace of their own (``fedsim/run/netns.py``): Flower and Ray authenticate no
  local client, so no other local user may reach their ports;
- runtime dependency installation off (the venv already has everything);
- the real outcome read back with ``flwr ls`` (``flwr run --stream`` exits 0 on failure);
- every process started here is stopped by process group when the run ends, the ServerApp first;
  SIGTERM and SIGINT stop the run the same way (``Interrupted``), and a watchdog
  (``fedsim/run/watchdog.py``) ends every process of the run, the ServerApp first, when the launcher
  itself is killed (SIGKILL, OOM killer).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TextIO

import httpx
import tomli_w
from omegaconf import DictConfig

from fedsim.config.data import REPO_ROOT, who_else_writes
from fedsim.config.node_local import SETTINGS, environment, from_run, supernode_config
from fedsim.progress import Bars, is_noise
from fedsim.results.outputs import RESULTS_MARKER, unpack_results
from fedsim.results.provenance import HOST_ENV
from fedsim.run.netns import HOST, Host, Namespace, NamespaceUnavailable, listening
from fedsim.run.tls import Certificates, make_federation, partition_keys
from fedsim.run.watchdog import ENV_KEY, end_server_apps
from fedsim.runtime.flower_waits import SUPEREXEC_POLL_ENV
from fedsim.runtime.journal import NODE_KEYS_ENV

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
    env.update(
        {
            ENV_KEY: token,
            "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


class Process:
    """A child in its own process group (on ``net``), killed with its whole tree on exit."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict, log: Path, net: Host = HOST):
        self.cmd, self.log = cmd, log
        self._fh = open(log, "ab")
        self.proc = subprocess.Popen(
            net.command(cmd),
            cwd=cwd,
            env=env,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=net.fds,
        )

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


def superlink_command(
    port: int,
    certs: Certificates | None,
    node_auth: bool,
    host: str = "127.0.0.1",
    simulation: bool = False,
) -> list[str]:
    """``flower-superlink``'s command line: TLS from ``certs`` (``None``: plain text). Its state
    (runs, nodes, messages and their objects) stays in memory, Flower's default: the run's
    working folder, and a state file in it, goes with the run, and a file costs each object a
    SQLite write and read (``bench/deploy_exchange.py``: FedE4RAG's 12.9 MB encrypted reply
    3.9 s with a file, 1.6 s without; docs/benchmarks/deployment.md)."""
    tls = (
        [
            "--ssl-ca-certfile",
            str(certs.ca),
            "--ssl-certfile",
            str(certs.superlink_cert),
            "--ssl-keyfile",
            str(certs.superlink_key),
        ]
        if certs
        else ["--insecure"]
    )
    return [
        str(BIN / "flower-superlink"),
        *tls,
        "--isolation",
        "subprocess",
        "--host",
        host,
        "--port",
        str(port),
        "--disable-runtime-dependency-installation",
        *(["--enable-supernode-auth"] if node_auth else []),
        *(["--simulation"] if simulation else []),
    ]


def supernode_command(
    superlink: str,
    partition: int,
    partitions: int,
    node: Mapping[str, str],
    certs: Certificates | None,
    node_auth: bool,
    port: int,
    waits: Mapping | None = None,
    preload: list[str] | None = None,
    workers: int = 0,
) -> list[str]:
    """``flower-supernode``'s command line for client ``partition`` of ``partitions``, with the
    node's own folders ``node`` (``fedsim/config/node_local.py``: data-root, state-dir, ...); run
    through ``fedsim.run.supernode`` when ``waits`` (``hardware.waits``) shortens a SuperNode wait
    or ``preload`` (``hardware.clientapp_preload``) warms its ClientApp processes, of which
    ``workers`` per run serve its messages one after another (``hardware.clientapp_workers``)."""
    node_config = (
        f"partition-id={partition} num-partitions={partitions} {supernode_config(node)}".rstrip()
    )
    tls = ["--root-certificates", str(certs.ca)] if certs else ["--insecure"]
    auth = ["--auth-supernode-private-key", str(certs.node_key(partition))] if node_auth else []
    flower = [
        *tls,
        *auth,
        "--superlink",
        superlink,
        "--node-config",
        node_config,
        "--port",
        str(port),
    ]
    options = (
        []
        if waits is None
        else [
            f"--{flag}={waits[key]}"
            for flag, key in (
                ("idle-wait", "supernode_idle"),
                ("reply-wait", "supernode_reply"),
                ("pull-backoff", "pull_backoff"),
            )
            if waits.get(key) is not None
        ]
    )
    options += [] if preload is None else [f"--preload={','.join(preload)}"]
    options += [f"--workers={workers}"] if preload is not None and workers else []
    if not options:
        return [str(BIN / "flower-supernode"), *flower]
    return [sys.executable, "-m", "fedsim.run.supernode", *options, "--", *flower]


def supernode_env(env: dict, waits: Mapping | None) -> dict:
    """``env`` with the SuperExec's task poll (Flower's own setting) when ``waits`` sets it;
    the SuperNode starts its SuperExec with this environment."""
    poll = None if waits is None else waits.get("superexec_poll")
    return env if poll is None else {**env, SUPEREXEC_POLL_ENV: str(poll)}


def connection(address: str, certs: Certificates | None) -> dict:
    """The ``config.toml`` entry by which ``flwr`` reaches the SuperLink."""
    if certs is None:
        return {"address": address, "insecure": True}
    return {"address": address, "root-certificates": str(certs.ca)}


def write_connection(home: Path, address: str, certs: Certificates | None) -> None:
    (home / "config.toml").write_text(
        tomli_w.dumps({"superlink": {"default": "fedsim", "fedsim": connection(address, certs)}})
    )


def _health_client(certs: Certificates | None) -> tuple[str, dict]:
    if certs is None:
        return "http", {}
    return "https", {"verify": ssl.create_default_context(cafile=str(certs.ca))}


def wait_healthy(address: str, certs: Certificates | None, timeout: float = 60.0) -> None:
    """Wait for a remote SuperLink's ``/health``, over this machine's network."""
    scheme, options = _health_client(certs)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{scheme}://{address}/health", timeout=0.5, **options).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RunFailed(f"SuperLink {address} not healthy after {timeout:.0f} s")


def wait_listening(proc: Process, port: int, timeout: float = 60.0) -> None:
    """Wait until the local SuperLink ``proc`` listens on ``port``: uvicorn binds once the
    SuperLink's startup is done, so its ``/health`` answers from then on. Read from /proc, which
    shows the port also when it lies in the run's network namespace, out of this process's reach."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RunFailed(
                f"{proc.cmd[0]} exited with {proc.proc.returncode}; "
                f"log: {proc.log}\n{proc.log.read_text()[-3000:]}"
            )
        if port in {p for _, p in listening(proc.proc.pid)}:
            return
        time.sleep(0.3)
    raise RunFailed(
        f"SuperLink not listening on port {port} after {timeout:.0f} s; log: {proc.log}"
    )


def start_superlink(
    workdir: Path,
    env: dict,
    simulation: bool,
    certs: Certificates | None = None,
    node_auth: bool = False,
    net: Host = HOST,
) -> tuple[Process, int]:
    port = free_port()
    proc = Process(
        superlink_command(port, certs, node_auth, simulation=simulation),
        workdir,
        env,
        workdir / "superlink.log",
        net,
    )
    wait_listening(proc, port)
    return proc, port


def register_nodes(certs: Certificates, count: int, env: dict, cwd: Path, net: Host) -> None:
    """Register every SuperNode's public key with the SuperLink (``--enable-supernode-auth``
    refuses any node whose key was not registered)."""
    for i in range(count):
        res = _flwr(["supernode", "register", str(certs.node_pub(i)), "fedsim"], env, cwd, net)
        if res.returncode != 0:
            raise RunFailed(f"could not register SuperNode {i}: {res.stdout}{res.stderr}")


def start_supernodes(
    workdir: Path,
    env: dict,
    superlink_port: int,
    count: int,
    node: Mapping[str, str],
    certs: Certificates | None = None,
    node_auth: bool = False,
    waits: Mapping | None = None,
    preload: list[str] | None = None,
    net: Host = HOST,
    workers: int = 0,
) -> list[Process]:
    return [
        Process(
            supernode_command(
                f"127.0.0.1:{superlink_port}",
                partition_id,
                count,
                node,
                certs,
                node_auth,
                free_port(),
                waits,
                preload,
                workers,
            ),
            workdir,
            supernode_env(env, waits),
            workdir / f"supernode-{partition_id}.log",
            net,
        )
        for partition_id in range(count)
    ]


def user_certificates(hw: DictConfig, nodes: int) -> Certificates | None:
    """The user's certificate folder (``hardware.certificates``), its files checked for the
    roles this machine plays; None when none is given."""
    if hw.backend != "deployment" or hw.insecure or not hw.certificates:
        return None
    certs = Certificates(Path(str(hw.certificates)).expanduser().resolve())
    local = bool(hw.launch_local)
    certs.check(nodes if local and hw.node_auth else 0, server=local)
    return certs


def certificates(hw: DictConfig, workdir: Path, nodes: int, echo) -> Certificates | None:
    """The run's TLS material: none when ``insecure`` (with a warning), the user's folder, or
    for a local federation a private CA made for this run."""
    if hw.insecure:
        echo(
            "fedsim: WARNING: hardware.insecure=true: traffic to the SuperLink is not "
            "encrypted and SuperNodes are not authenticated"
        )
        return None
    if hw.certificates:
        return user_certificates(hw, nodes)
    if not hw.launch_local:
        raise RunFailed(
            "hardware.certificates is required for a remote SuperLink (a folder "
            "with its CA as ca.pem), or hardware.insecure=true"
        )
    return make_federation(workdir / "certs", ["127.0.0.1", "localhost"], nodes)


def _flwr(args: list[str], env: dict, cwd: Path, net: Host = HOST) -> subprocess.CompletedProcess:
    return subprocess.run(
        net.command([str(BIN / "flwr"), *args]),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        pass_fds=net.fds,
    )


def run_status(run_id: str, env: dict, cwd: Path, net: Host) -> str:
    res = _flwr(["ls", "--run-id", run_id, "--format", "json"], env, cwd, net)
    try:
        runs = json.loads(res.stdout)["runs"]
        return runs[0]["status"]
    except (ValueError, KeyError, IndexError) as exc:
        raise RunFailed(
            f"could not read the status of run {run_id}: {res.stdout}{res.stderr}"
        ) from exc


@contextmanager
def _signals_interrupt():
    """SIGTERM / SIGINT raise :class:`Interrupted`, so the ExitStack stops what was started."""

    def raise_interrupted(signum, frame):
        for sig in previous:  # a second signal must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(128 + signum)

    previous = {
        sig: signal.signal(sig, raise_interrupted) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _watchdog(stack: ExitStack, token: str, workdir: Path) -> None:
    """Start the watchdog; on the way out close its pipe and let it sweep stragglers."""
    argv = [sys.executable, "-m", "fedsim.run.watchdog", token, str(workdir), str(os.getpid())]
    dog = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=str(REPO_ROOT),
    )

    def release():
        dog.stdin.close()
        try:
            dog.wait(30)
        except subprocess.TimeoutExpired:
            dog.kill()

    stack.callback(release)


def _stream(cmd: list[str], workdir: Path, env: dict, echo, net: Host) -> tuple[int, str | None]:
    """Run ``flwr run --stream`` in its own process group, echo its output, return its exit
    code and the run id; its group is killed if we leave early (an interrupt)."""
    proc = subprocess.Popen(
        net.command(cmd),
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        start_new_session=True,
        pass_fds=net.fds,
    )
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


def private_network(hw: DictConfig) -> bool:
    """Whether the run's processes get a network namespace of their own: a local SuperLink's
    (a remote one is reached over this machine's network) unless ``hardware.private_network``
    is off."""
    return bool(hw.private_network) and (hw.backend == "simulation" or bool(hw.launch_local))


def check_private_network(hw: DictConfig) -> None:
    """Refuse, before the run, a private network this machine does not allow (unprivileged user
    namespaces off, as under Ubuntu 24.04's AppArmor default, or a container's seccomp)."""
    if not private_network(hw):
        return
    try:
        Namespace().close()
    except NamespaceUnavailable as exc:
        raise ValueError(
            f"hardware.private_network: this machine refuses this user a network namespace ({exc}). "
            "Allow unprivileged user namespaces (e.g. sysctl kernel.apparmor_restrict_unprivileged_userns=0) "
            "or set hardware.private_network=false: the run's SuperLink, SuperNodes and Ray then "
            "listen on this machine's network, where any local user can list, stop or join the run "
            "(docs/architecture.md#threat-model)"
        ) from exc


def check_ray_cluster(hw: DictConfig, timeout: float = 5.0) -> None:
    """Refuse, before the run, a Ray cluster address (``hardware.ray_address``) where nothing
    accepts a connection: Ray's driver would otherwise wait and fail inside the run."""
    if hw.ray_address is None:
        return
    host, _, port = str(hw.ray_address).rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ValueError(
            f"hardware.ray_address: nothing answers at {hw.ray_address} ({exc}); start the "
            f"cluster's head there (`ray start --head --port={port}`), or run on Ray started "
            "for the run (leave hardware=ray_cluster out)"
        ) from exc


def keep_logs(workdir: Path, results_dir: Path):
    """An exit callback for :func:`launch`: where the run failed, the logs of its processes (the
    SuperLink with the SuperExec it starts, the ServerApp's as Flower relayed it, each SuperNode),
    which lie in the work folder that goes with the run, copied into a new 0700 folder ``logs-*``
    of ``results_dir`` (nothing there is overwritten, nothing followed: a log that is a link is
    left out, as its target may be any file of this user's, and results travel); the error names
    the copies."""

    def keep(exc_type, exc, tb) -> bool:
        logs = sorted(
            log for log in workdir.glob("*.log") if log.is_file() and not log.is_symlink()
        )
        if not isinstance(exc, RunFailed) or not logs:
            return False
        try:
            kept = Path(tempfile.mkdtemp(prefix="logs-", dir=results_dir))
            for log in logs:
                shutil.copyfile(log, kept / log.name)
        except OSError:
            return False  # the failure itself matters more than its logs
        message = str(exc)
        for log in logs:  # a log the message names
            message = message.replace(str(log), str(kept / log.name))
        copies = ", ".join(str(kept / log.name) for log in logs)
        raise RunFailed(f"{message}\nthe logs of the run's processes: {copies}") from exc

    return keep


SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (AF_UNIX on Linux), as Ray checks them
RAY_SOCKET_TAIL = len(
    "/ray/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"
)  # under RAY_TMPDIR


def ray_tmpdir(stack: ExitStack, workdir: Path) -> Path:
    """Where Ray keeps its session (logs, sockets, spilled objects): the run's 0700 work folder
    (Ray makes its folders 0777 for other users to share, which under /tmp/ray would let them
    read the workers' logs and plant files the workers use). Its socket paths must fit in
    :data:`SOCKET_PATH_MAX` (a TMPDIR of about 20 characters more broke every simulation): under a
    longer TMPDIR, Ray reaches the work folder by a link in a 0700 folder of /tmp, removed with
    the run, so that its session stays in the work folder; without /tmp, an error before anything
    starts."""
    if len(bytes(workdir)) + RAY_SOCKET_TAIL <= SOCKET_PATH_MAX:
        return workdir
    try:
        short = Path(tempfile.mkdtemp(prefix="fedsim-ray-", dir="/tmp"))
    except OSError as exc:
        raise RunFailed(
            f"Ray's socket paths under {workdir} would pass {SOCKET_PATH_MAX} bytes, and no "
            f"short folder could be made in /tmp ({exc}): set TMPDIR to a shorter folder"
        ) from exc
    stack.callback(shutil.rmtree, short, ignore_errors=True)
    (short / "run").symlink_to(workdir, target_is_directory=True)
    return short / "run"


def simulation_env(env: dict, hw: DictConfig) -> dict:
    """``env`` for a simulation's SuperLink, whose Flower simulation process runs the Ray driver:
    Ray joins the cluster named by ``RAY_ADDRESS`` (Flower's federation config carries no
    address), so it is set to ``hardware.ray_address``, or removed where the run starts its own
    Ray (a shell's ``RAY_ADDRESS`` would otherwise send the run to another cluster)."""
    out = {k: v for k, v in env.items() if k != "RAY_ADDRESS"}
    return out if hw.ray_address is None else {**out, "RAY_ADDRESS": str(hw.ray_address)}


def federation_config(hw: DictConfig, num_supernodes: int) -> str:
    """Flower's simulation sizing: SuperNodes and each ClientApp actor's resources; Ray's CPUs
    only for the Ray the run starts (an existing cluster's nodes declared theirs at ``ray
    start``, and Ray refuses ``num_cpus`` from a driver that joins one)."""
    own = "" if hw.ray_address is not None else f" init-args-num-cpus={int(hw.num_cpus)}"
    return (
        f"num-supernodes={num_supernodes} client-resources-num-cpus={int(hw.client_cpus)} "
        f"client-resources-num-gpus={float(hw.client_gpus)}{own}"
    )


def _warn_node_settings(cfg: DictConfig, echo) -> None:
    """A cluster's clients run under the environment its nodes were started with (``ray start``),
    not this process's: the run's node-local folders (``fedsim/config/node_local.py``) do not reach them."""
    given = from_run(cfg)
    if given:
        names = ", ".join(
            f"{SETTINGS[key][1]}={value} (there: ${SETTINGS[key][0]})"
            for key, value in given.items()
        )
        echo(
            f"fedsim: WARNING: the Ray cluster's clients take their folders from the environment "
            f"each node was started with (`ray start`), not from this run: {names}"
        )


def _network(stack: ExitStack, hw: DictConfig, echo) -> Host:
    """The network the run's processes are started on; warns when a local run's is shared."""
    if private_network(hw):
        try:
            net = Namespace()
        except NamespaceUnavailable as exc:
            raise RunFailed(f"no network namespace for the run: {exc}") from exc
        stack.callback(net.close)
        return net
    if hw.backend == "simulation" or hw.launch_local:
        echo(
            "fedsim: WARNING: hardware.private_network=false: the run's SuperLink, SuperNodes and "
            "Ray listen on this machine's network; any local user can list, stop or join the run"
        )
    return HOST


def _start_local(
    stack: ExitStack,
    cfg: DictConfig,
    workdir: Path,
    env: dict,
    simulation: bool,
    nodes: int,
    certs: Certificates | None,
    net: Host,
) -> str:
    """A private SuperLink (and, for a deployment, its SuperNodes, registered first when node
    authentication is on) on ``net``; returns its address."""
    auth = bool(not simulation and certs is not None and cfg.hardware.node_auth)
    if auth:  # the ServerApp (the SuperLink's child) holds each node's partition to its key
        env[NODE_KEYS_ENV] = partition_keys(certs, nodes)
    link, port = start_superlink(workdir, env, simulation, certs, auth, net)
    stack.enter_context(link)
    address = f"127.0.0.1:{port}"
    write_connection(workdir / "flwr_home", address, certs)
    if not simulation:
        if auth:
            register_nodes(certs, nodes, env, workdir, net)
        for node in start_supernodes(
            workdir,
            env,
            port,
            nodes,
            from_run(cfg),
            certs,
            auth,
            cfg.hardware.waits,
            cfg.hardware.clientapp_preload,
            net,
            cfg.hardware.clientapp_workers,
        ):
            stack.enter_context(node)
    return address


class _Results:
    """Echoes the run's log (the ServerApp's, as ``flwr run --stream`` relays it) and writes it to
    each of ``logs``; keeps the results a remote ServerApp ships in it. A line of Flower's noise
    (``fedsim.progress.NOISE``) is written, and echoed at ``logging.level=debug`` only."""

    def __init__(self, echo, logs: list[TextIO], quiet: bool):
        self.echo, self.logs, self.quiet, self.lines = echo, logs, quiet, []

    def __call__(self, line: str) -> None:
        if line.startswith(RESULTS_MARKER):
            self.lines.append(line)
            return
        if not (self.quiet and is_noise(line)):
            self.echo(line)
        for log in self.logs:
            log.write(line + "\n")


def run_log(results_dir: Path) -> TextIO | None:
    """``results_dir/fedsim.log``, appended to (a resumed run's log keeps its first part), never
    through a link; None where this process's output already goes there (a sweep's point)."""
    path = results_dir / "fedsim.log"
    try:
        if path.exists() and os.path.samestat(os.fstat(sys.stdout.fileno()), path.lstat()):
            return None
    except (OSError, ValueError):  # stdout without a file (captured)
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
    return os.fdopen(fd, "a", buffering=1)


def launch(cfg: DictConfig, overrides: list[str], num_supernodes: int, echo=print) -> dict:
    """Run ``overrides`` through Flower on the backend of ``cfg.hardware``; return the status.
    A remote SuperLink's ServerApp ships its results folder back in the run's log."""
    hw = cfg.hardware
    simulation = hw.backend == "simulation"
    remote = not (simulation or hw.launch_local)
    results_dir = Path(cfg.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    if why := who_else_writes(results_dir):  # made by another user between the check and this mkdir
        raise PermissionError(f"results_dir: {why}")
    workdir = Path(tempfile.mkdtemp(prefix="fedsim-run-"))
    home = workdir / "flwr_home"
    home.mkdir()
    token = uuid.uuid4().hex  # fresh per run: two runs never share one (and never end each other)
    env = {
        **environment(cfg, simulation_env(_env(home, token), hw)),  # + the node's folders
        HOST_ENV: platform.node(),
    }  # the run's namespace names its host localhost
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        stack.push(
            keep_logs(workdir, results_dir)
        )  # once the processes have stopped, before the folder goes
        env["RAY_TMPDIR"] = str(ray_tmpdir(stack, workdir))
        _watchdog(stack, token, workdir)
        stack.enter_context(_signals_interrupt())
        certs = None if simulation else certificates(hw, workdir, num_supernodes, echo)
        net = _network(stack, hw, echo)
        if remote:
            address = str(hw.superlink)
            write_connection(home, address, certs)
            wait_healthy(address, certs, timeout=30.0)
        else:
            address = _start_local(stack, cfg, workdir, env, simulation, num_supernodes, certs, net)
        # first on the way out, before SuperNodes, SuperLink and Ray: a ServerApp left running while
        # they stop would journal their ClientApps' deaths as client failures (fedsim/run/watchdog.py)
        stack.callback(end_server_apps, workdir, token)
        run_config = workdir / "run_config.toml"
        run_config.write_text(
            tomli_w.dumps(
                {"overrides": shlex.join([*overrides, *(["ship_results=true"] if remote else [])])}
            )
        )
        cmd = [  # `flwr run` whose FAB build skips .venv (fedsim/run/flwr_run.py)
            sys.executable,
            "-P",
            "-m",
            "fedsim.run.flwr_run",
            "run",
            str(REPO_ROOT),
            "fedsim",
            "--stream",
            "--run-config",
            str(run_config),
        ]
        if simulation:
            cmd += ["--federation-config", federation_config(hw, num_supernodes)]
        security = (
            "plain text"
            if certs is None
            else "TLS" + (" + node authentication" if hw.node_auth and not simulation else "")
        )
        where = " in the run's own network namespace" if isinstance(net, Namespace) else ""
        if hw.ray_address is not None:
            where = f", clients on the Ray cluster at {hw.ray_address}"
            _warn_node_settings(cfg, echo)
        echo(
            f"fedsim: {num_supernodes} SuperNodes, {hw.backend} via SuperLink {address} "
            f"({security}){where}; results -> {results_dir}"
        )
        kept = run_log(results_dir)
        shipped = _Results(
            stack.enter_context(Bars(echo)),
            [stack.enter_context(open(workdir / "serverapp.log", "w"))]
            + ([stack.enter_context(kept)] if kept else []),
            quiet=cfg.logging.level != "debug",
        )
        code, run_id = _stream(cmd, workdir, env, shipped, net)
        if shipped.lines:
            try:
                unpack_results(shipped.lines, results_dir)
            except (ValueError, OSError) as exc:
                raise RunFailed(f"the run's results did not arrive whole: {exc}") from exc
        if code != 0 or run_id is None:
            raise RunFailed(f"`flwr run` could not start the run (exit {code})")
        status = run_status(run_id, env, workdir, net)
        error = results_dir / "error.txt"
        if status != "finished:completed" or error.exists():
            detail = error.read_text() if error.exists() else "(no error.txt; see the log above)"
            raise RunFailed(f"Flower run {run_id} ended as {status}.\n{detail}")
        if not (results_dir / "results.json").exists():
            raise RunFailed(f"run {run_id} completed but no results.json reached {results_dir}")
        return {"run_id": run_id, "status": status, "results_dir": str(results_dir)}
