"""docker/compose.yaml on this host's loopback: a SuperLink (TLS, SuperNode authentication), its
ServerApp runner and two SuperNodes, each in its container, run a small FedTP federation that
`fedsim run hardware=deploy_remote` submits; a SuperNode whose key was never registered is
refused. Skipped without a Docker engine, a compose client or the images (docs/deploy.md, "With Docker")."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import read_results
from fedsim.data import REPO_ROOT, resolve_data_root
from fedsim.launcher import free_port, wait_healthy, write_connection
from fedsim.tls import make_federation

pytestmark = [pytest.mark.docker, pytest.mark.e2e]

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
    if shutil.which("docker") is None:
        return "no docker client"
    info = _run(["docker", "info"], timeout=60)
    if info.returncode != 0:
        return f"no Docker engine (`docker info` failed: {info.stderr.strip()[-300:]})"
    missing = [image for image in IMAGES if _run(["docker", "image", "inspect", image]).returncode]
    if missing:
        return f"images missing: {', '.join(missing)} (build them: docs/deploy.md, With Docker)"
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
        self.certs = make_federation(work / "certs", ["127.0.0.1", "localhost", "superlink"], NODES + 1)
        self.home = work / "flwr_home"
        self.home.mkdir()
        write_connection(self.home, self.address, self.certs)
        self.env = {**os.environ, "FEDSIM_PORT": str(self.port), "FEDSIM_SUPERLINK": self.address,
                    "FEDSIM_CERTS": str(self.certs.folder), "FEDSIM_DATA": str(resolve_data_root()),
                    "FEDSIM_UID": str(os.getuid()), "FEDSIM_GID": str(os.getgid()),
                    **{f"FEDSIM_NODE{i}_PORT": str(free_port()) for i in range(NODES)}}
        self.compose = [*_compose_client(), "-f", str(COMPOSE_FILE),
                        "-p", f"fedsim-test-{uuid.uuid4().hex[:8]}"]

    def dc(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        res = _run([*self.compose, *args], timeout=timeout, env=self.env)
        if check and res.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} exited {res.returncode}:\n"
                                 f"{res.stdout}{res.stderr}")
        return res

    def flwr(self, *args: str) -> subprocess.CompletedProcess:
        return _run([FLWR, *args], timeout=120, env={**os.environ, "FLWR_HOME": str(self.home)},
                    cwd=self.work)

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
        raise AssertionError(f"fewer than {count} SuperNodes online: {nodes}\n{self.logs()[-6000:]}")

    def logs(self, *services: str) -> str:
        res = self.dc("logs", "--no-color", *services, check=False)
        return res.stdout + res.stderr


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
        left = _run(["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={fed.compose[-1]}"])
        assert left.stdout.strip() == "", f"containers left: {left.stdout}"


def test_fedtp_through_compose_federation(federation, run_small):
    code, log, out = run_small("hardware=deploy_remote", f"hardware.superlink={federation.address}",
                               f"hardware.certificates={federation.certs.folder}",
                               f"hardware.num_supernodes={NODES}", "task.max_per_split=2", timeout=600)
    assert code == 0, f"{log}\n--- compose logs ---\n{federation.logs()[-6000:]}"
    assert f"deployment via SuperLink {federation.address} (TLS + node authentication)" in log
    res = read_results(out)  # written in the serverapp container, shipped back in the run's log
    assert res["supernodes"] == NODES and res["conversations"] == 8
    assert res["prior_clients"]["count"] == 4 and res["prior_clients"]["nodes"] == NODES
    assert res["routers"]["fedmix"]["overall"]["turns"] > 0


def test_unregistered_supernode_is_refused(federation):
    name = f"fedsim-unregistered-{uuid.uuid4().hex[:8]}"
    cmd = ["docker", "run", "--rm", "--name", name, "--network", "host",
           "-u", f"{os.getuid()}:{os.getgid()}", "-v", f"{federation.certs.folder}:/certs:ro",
           "fedsim-supernode:cpu", "--root-certificates", "/certs/ca.pem",
           "--superlink", federation.address, "--auth-supernode-private-key", f"/certs/node-{NODES}.key",
           "--port", str(free_port()), "--max-retries", "2", "--max-wait-time", "30",
           "--node-config", f"partition-id=0 num-partitions={NODES}"]
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
