"""docker/compose.yaml on this host's loopback: a SuperLink (TLS, SuperNode authentication), its
ServerApp runner and two SuperNodes, each in its container, run a small FedTP federation that
`fedsim run hardware=deploy_remote` submits; a SuperNode whose key was never registered is
refused; a SuperNode container killed mid-run and started again costs the run only that node's
exchanges, counted in its faults. Those tests are skipped, with the reason, without a Docker
engine, a compose client or the images (docs/deploy.md, "With Docker"). Which files each
service mounts is checked without an engine."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from test_e2e_secagg import every_exchange_reached_all

from conftest import fedsim_run, read_results
from fedsim.config.data import REPO_ROOT, resolve_data_root
from fedsim.run.launcher import free_port, wait_healthy, write_connection
from fedsim.run.tls import make_federation

DOCKER = [pytest.mark.docker, pytest.mark.e2e]  # the tests that run the compose topology

COMPOSE_FILE = REPO_ROOT / "docker" / "compose.yaml"
IMAGES = ("fedsim-superlink:latest", "fedsim-serverapp:cpu", "fedsim-supernode:cpu")
NODES = 2
FLWR = str(Path(sys.executable).parent / "flwr")


def _run(cmd: list[str], timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)


def _compose_client() -> list[str] | None:
    if _run(["docker", "compose", "version"], timeout=60).returncode == 0:
        return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def _skip_reason() -> str | None:
    """Why the compose tests cannot run here (None: they can), naming what is missing and how
    to get it; never builds an image."""
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    engine = _run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=60)
    if engine.returncode != 0:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        why = (engine.stderr.strip().splitlines() or ["no answer"])[-1][-300:]
        return f"no Docker engine at {where} ({why}); start one: docs/deploy.md, With Docker"
    missing = [image for image in IMAGES if _run(["docker", "image", "inspect", image]).returncode]
    if missing:
        return (
            f"Docker engine {engine.stdout.strip()} has no image {', '.join(missing)} "
            "(build them with docker/build.sh: docs/deploy.md, With Docker)"
        )
    if _compose_client() is None:
        return "no compose client (`docker compose` or `docker-compose`)"
    return None


class Federation:
    """The running compose project: its address, certificates and a FLWR_HOME that reaches it."""

    def __init__(self, work: Path):
        self.work = work
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # node-I for I < NODES are registered; node-NODES never is (the refusal check)
        self.certs = make_federation(
            work / "certs", ["127.0.0.1", "localhost", "superlink"], NODES + 1
        )
        self.home = work / "flwr_home"
        self.home.mkdir()
        write_connection(self.home, self.address, self.certs)
        self.env = {
            **os.environ,
            "FEDSIM_PORT": str(self.port),
            "FEDSIM_SUPERLINK": self.address,
            "FEDSIM_CERTS": str(self.certs.folder),
            "FEDSIM_DATA": str(resolve_data_root()),
            "FEDSIM_UID": str(os.getuid()),
            "FEDSIM_GID": str(os.getgid()),
            **{f"FEDSIM_NODE{i}_PORT": str(free_port()) for i in range(NODES)},
        }
        self.compose = [
            *_compose_client(),
            "-f",
            str(COMPOSE_FILE),
            "-p",
            f"fedsim-test-{uuid.uuid4().hex[:8]}",
        ]

    def dc(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess:
        res = _run([*self.compose, *args], timeout=timeout, env=self.env)
        if check and res.returncode != 0:
            raise AssertionError(
                f"compose {' '.join(args)} exited {res.returncode}:\n{res.stdout}{res.stderr}"
            )
        return res

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        return _run(
            [FLWR, *args],
            timeout=120,
            env={**os.environ, "FLWR_HOME": str(self.home)},
            cwd=self.work,
        )

    def nodes(self) -> list[dict]:
        res = self.flwr("supernode", "list", "fedsim", "--format", "json")
        assert res.returncode == 0, res.stdout + res.stderr
        return json.loads(res.stdout)["nodes"]

    def wait_online(self, count: int, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = self.nodes()
            if sum(node["status"] == "online" for node in nodes) >= count:
                return
            time.sleep(2)
        raise AssertionError(
            f"fewer than {count} SuperNodes online: {nodes}\n{self.logs()[-6000:]}"
        )

    def logs(self, *services: str) -> str:
        res = self.dc("logs", "--no-color", *services, check=False)
        return res.stdout + res.stderr

    def container(self, service: str) -> str:
        """The id of ``service``'s container (compose v1 and v2 name them differently)."""
        return self.dc("ps", "-q", service).stdout.strip()


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    fed = Federation(tmp_path_factory.mktemp("docker"))
    try:
        fed.dc("up", "-d", "superlink")
        wait_healthy(fed.address, fed.certs, timeout=90)
        fed.dc("run", "--rm", "register", *(f"/certs/node-{i}.pub" for i in range(NODES)))
        fed.dc("up", "-d", "serverapp", *(f"supernode-{i}" for i in range(NODES)))
        fed.wait_online(NODES)
        yield fed
    finally:
        (fed.work / "compose.log").write_text(fed.logs())
        fed.dc("down", "-v", "--remove-orphans", "-t", "20", check=False)
        left = _run(
            [
                "docker",
                "ps",
                "-aq",
                "--filter",
                f"label=com.docker.compose.project={fed.compose[-1]}",
            ]
        )
        assert left.stdout.strip() == "", f"containers left: {left.stdout}"


def connection(federation: Federation) -> list[str]:
    """The overrides that submit a run to the compose federation."""
    return [
        "hardware=deploy_remote",
        f"hardware.superlink={federation.address}",
        f"hardware.certificates={federation.certs.folder}",
        f"hardware.num_supernodes={NODES}",
    ]


def remote(federation: Federation) -> list[str]:
    """The overrides of a small FedTP run submitted to the compose federation."""
    return [*connection(federation), "task.max_per_split=2"]


CERT_PATH = re.compile(r"/certs/[\w.-]+")


def topologies() -> dict[str, dict]:
    """compose.yaml's services, alone and with docker/supernodes.sh's 3-node override merged
    over them (a key of the override replaces the base's, as far as this test reads)."""
    base = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    override = yaml.safe_load(
        subprocess.run(
            ["sh", str(COMPOSE_FILE.parent / "supernodes.sh"), "3"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["services"]
    merged = {name: {**base.get(name, {}), **service} for name, service in override.items()}
    return {"compose.yaml": base, "supernodes.sh 3": {**base, **merged}}


def test_every_file_a_service_reads_is_mounted():
    """Each service mounts the /certs files that its entrypoint, command and entrypoint script
    name, and no private key it does not use (registration once dialled the SuperLink without
    the CA it names: TLS failed, reported as 'SuperLink not reachable')."""
    for topology, services in topologies().items():
        for name, service in services.items():
            argv = [*service.get("entrypoint", []), *service.get("command", [])]
            read = set(CERT_PATH.findall(" ".join(argv)))
            script = COMPOSE_FILE.parent / Path(argv[0]).name if argv else None
            if script is not None and script.is_file():
                read |= set(CERT_PATH.findall(script.read_text()))
            mounted = {
                m.group(1)
                for v in service.get("volumes", [])
                if (m := re.search(r":(/certs/[^:]+)", v))
            }
            assert read <= mounted, (
                f"{topology}: {name} reads {sorted(read - mounted)}, not mounted"
            )
            unused_keys = {path for path in mounted - read if path.endswith(".key")}
            assert not unused_keys, (
                f"{topology}: {name} mounts private keys it does not use: {sorted(unused_keys)}"
            )


@pytest.mark.docker
@pytest.mark.e2e
def test_fedtp_through_compose_federation(federation, run_small):
    code, log, out = run_small(*remote(federation), timeout=600)
    assert code == 0, f"{log}\n--- compose logs ---\n{federation.logs()[-6000:]}"
    assert f"deployment via SuperLink {federation.address} (TLS + node authentication)" in log
    res = read_results(out)  # written in the serverapp container, shipped back in the run's log
    assert res["supernodes"] == NODES and res["conversations"] == 8
    assert res["prior_clients"]["count"] == 4 and res["prior_clients"]["nodes"] == NODES
    assert res["routers"]["fedmix"]["overall"]["turns"] > 0


# turn sentiment's 6 clients on the 2 SuperNode containers (3 each), 2 rounds, every client a
# SecAgg neighbour (docs/secure-aggregation.md, Deployments)
SECAGG = [
    "experiment=turn_sentiment_fedavg",
    "privacy=secagg",
    "num_rounds=2",
    "hardware.num_clients=6",
    "hardware.clients_per_supernode=3",
    "seed=0",
]


@pytest.mark.docker
@pytest.mark.e2e
def test_secagg_through_compose_federation(federation, tmp_path):
    """SecAgg+ across the containers: each round's exchanges reach every client through
    the SuperLink container (TLS, node authentication), and the unmasked means train the model
    above the majority class (0.414 of the test turns)."""
    out = tmp_path / "secagg"
    code, log = fedsim_run(*SECAGG, *connection(federation), f"results_dir={out}", timeout=900)
    assert code == 0, f"{log[-4000:]}\n--- compose logs ---\n{federation.logs()[-6000:]}"
    assert f"deployment via SuperLink {federation.address} (TLS + node authentication)" in log
    res = read_results(out)
    assert res["supernodes"] == NODES
    assert every_exchange_reached_all(res["faults"], 6, rounds=2)
    assert res["accuracy"] > 0.414


@pytest.mark.docker
@pytest.mark.e2e
def test_unregistered_supernode_is_refused(federation):
    name = f"fedsim-unregistered-{uuid.uuid4().hex[:8]}"
    cmd = [
        "docker",
        "run",
        "--rm",
        "--name",
        name,
        "--network",
        "host",
        "-u",
        f"{os.getuid()}:{os.getgid()}",
        "-v",
        f"{federation.certs.folder}:/certs:ro",
        "fedsim-supernode:cpu",
        "--root-certificates",
        "/certs/ca.pem",
        "--superlink",
        federation.address,
        "--auth-supernode-private-key",
        f"/certs/node-{NODES}.key",
        "--port",
        str(free_port()),
        "--max-retries",
        "2",
        "--max-wait-time",
        "30",
        "--node-config",
        f"partition-id=0 num-partitions={NODES}",
    ]
    try:
        res = _run(cmd, timeout=120)
    finally:
        _run(["docker", "rm", "-f", name])
    output = res.stdout + res.stderr
    assert res.returncode != 0, output
    assert "Failed to activate SuperNode" in output, output
    superlink = federation.logs("superlink")
    assert "No SuperNode found with the given public key" in superlink, superlink[-3000:]
    assert len(federation.nodes()) == NODES  # the refused key never became a node


def wait_for_line(container: str, line: str, after: int, run: Future, timeout: float = 300) -> None:
    """Wait until ``container``'s log holds ``line`` more than ``after`` times (its earlier runs
    wrote some); fail if the run ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not run.done():
        if log_count(container, line) > after:
            return
        time.sleep(0.2)
    raise AssertionError(
        f"{line!r} not logged by {container} before the run ended "
        f"or {timeout:.0f} s passed: {run.result() if run.done() else ''}"
    )


def log_count(container: str, line: str) -> int:
    res = _run(["docker", "logs", container], timeout=60)
    return (res.stdout + res.stderr).count(line)


@pytest.mark.docker
@pytest.mark.e2e
def test_supernode_killed_mid_run_comes_back(federation, run_small):
    """`docker kill` supernode-1 once it is receiving its prior training message (it replies
    seconds later: a ClientApp process to start), and start it again at once. The SuperLink
    refuses its key until its heartbeats have lapsed (Flower: 2 x 30 s), and compose's
    restart policy retries until it is admitted. The run completes: the node's training
    exchange is counted as failed or timed out, node 0's replies are all kept and results.json
    is whole; afterwards the node is online again under its node id."""
    before = sorted(node["node-id"] for node in federation.nodes())
    container = federation.container("supernode-1")
    receiving = "Receiving: train message"
    seen = log_count(container, receiving)
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(run_small, *remote(federation), "round_timeout=45", timeout=900)
        wait_for_line(container, receiving, seen, run)
        killed = _run(["docker", "kill", container])
        assert killed.returncode == 0, killed.stderr
        federation.dc("start", "supernode-1")
        code, log, out = run.result()
    assert code == 0, f"{log}\n--- compose logs ---\n{federation.logs()[-6000:]}"
    res = read_results(out)
    prior = res["faults"]["prior/train"]["1"]
    assert prior["sent"] == NODES and prior["accepted"] == NODES - 1 and prior["malformed"] == 0, (
        prior
    )
    assert prior["failed"] + prior["timed_out"] == 1, prior
    for phase, rounds in res["faults"].items():  # node 0 answered every exchange
        for row in rounds.values():
            assert row["accepted"] >= 1 and row["malformed"] == 0, (phase, row)
            assert row["accepted"] + row["failed"] + row["timed_out"] == row["sent"], (phase, row)
    assert res["conversations"] == 8 and 0 < res["prior_clients"]["count"] < 4
    assert all(
        res["routers"][router]["overall"]["turns"] > 0
        for router in ("tfidf", "global", "local", "fedmix")
    )
    federation.wait_online(NODES, timeout=300)
    assert sorted(node["node-id"] for node in federation.nodes()) == before
