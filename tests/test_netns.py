"""Separate hosts: the SuperLink, each SuperNode and the user's ``fedsim run`` each in a network
namespace of their own (``ip netns``, veth, one bridge), over TLS with node authentication.

Topology, all made here and removed afterwards (also when the test fails): namespace
``<p>-link`` holds a bridge with the SuperLink at 10.77.0.1; ``<p>-node<i>`` (10.77.0.1x) and
``<p>-user`` (10.77.0.100) hang off it by veth pairs. Nothing is routed to the host: traffic
stays between these namespaces. The user's run reaches the SuperLink as a remote one
(``hardware=deploy_remote``), so its results come back through the run's log.
"""

import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from conftest import FEDSIM, SMALL, private_tmpdir, read_results
from fedsim.config.compose import compose
from fedsim.config.data import resolve_data_root
from fedsim.run import launcher
from fedsim.run.tls import make_federation

LINK_IP, USER_IP, PORT = "10.77.0.1", "10.77.0.100", 9093


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN)"
    name = f"fsprobe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", name)
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"cannot create a network namespace here: {exc}"
    _ip("netns", "del", name)
    return None


pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(bool(_can_make_namespaces()), reason=str(_can_make_namespaces())),
]


class Hosts:
    """The namespaces of one federation; ``close`` removes them and what runs in them."""

    def __init__(self, nodes: int):
        self.prefix = f"fs{uuid.uuid4().hex[:5]}"
        self.link, self.user = f"{self.prefix}-link", f"{self.prefix}-user"
        self.nodes = [f"{self.prefix}-node{i}" for i in range(nodes)]
        self.created: list[str] = []
        self.processes: list[launcher.Process] = []
        _ip("netns", "add", self.link)
        self.created.append(self.link)
        self._in(self.link, "link", "set", "lo", "up")
        self._in(self.link, "link", "add", "br0", "type", "bridge")
        self._in(self.link, "addr", "add", f"{LINK_IP}/24", "dev", "br0")
        self._in(self.link, "link", "set", "br0", "up")
        for i, ns in enumerate([*self.nodes, self.user]):
            self._attach(ns, f"v{i}", USER_IP if ns == self.user else f"10.77.0.{10 + i}")

    def _in(self, ns: str, *args: str) -> None:
        _ip("-n", ns, *args)

    def _attach(self, ns: str, veth: str, address: str) -> None:
        _ip("netns", "add", ns)
        self.created.append(ns)
        self._in(ns, "link", "set", "lo", "up")
        self._in(
            self.link,
            "link",
            "add",
            f"{veth}b",
            "type",
            "veth",
            "peer",
            "name",
            f"{veth}h",
            "netns",
            ns,
        )
        self._in(self.link, "link", "set", f"{veth}b", "master", "br0")
        self._in(self.link, "link", "set", f"{veth}b", "up")
        self._in(ns, "addr", "add", f"{address}/24", "dev", f"{veth}h")
        self._in(ns, "link", "set", f"{veth}h", "up")

    def start(self, ns: str, cmd: list[str], cwd: Path, env: dict, log: Path) -> launcher.Process:
        proc = launcher.Process(["ip", "netns", "exec", ns, *cmd], cwd, env, log)
        self.processes.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.processes:
            proc.stop()
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture
def federation(tmp_path):
    """A SuperLink and two registered SuperNodes, each in its own namespace, over TLS."""
    hosts = Hosts(nodes=2)
    try:
        home = tmp_path / "operator"
        home.mkdir()
        env = {
            **launcher._env(home, uuid.uuid4().hex),
            "FEDSIM_DATA_ROOT": str(resolve_data_root()),
        }
        certs = make_federation(tmp_path / "certs", [LINK_IP, "127.0.0.1"], nodes=2)
        link = hosts.start(
            hosts.link,
            launcher.superlink_command(PORT, certs, node_auth=True, host="0.0.0.0"),
            tmp_path,
            env,
            tmp_path / "superlink.log",
        )
        # the operator registers the nodes from the SuperLink's own host
        launcher.write_connection(home, f"127.0.0.1:{PORT}", certs)
        flwr = ["ip", "netns", "exec", hosts.link, str(launcher.BIN / "flwr")]
        deadline = time.monotonic() + 60
        while (
            subprocess.run(
                [*flwr, "supernode", "list", "fedsim"], env=env, capture_output=True
            ).returncode
            != 0
        ):
            assert link.alive() and time.monotonic() < deadline, link.log.read_text()[-2000:]
            time.sleep(0.5)
        hardware = compose(
            ["hardware=deploy_local"]
        ).hardware  # its waits shortened, its warm ClientApps
        waits, preload = dict(hardware.waits), list(hardware.clientapp_preload)
        for i, ns in enumerate(hosts.nodes):
            res = subprocess.run(
                [*flwr, "supernode", "register", str(certs.node_pub(i)), "fedsim"],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert res.returncode == 0, res.stdout + res.stderr
            # each node's own folders (one machine here: the key folder is the federation's copy)
            node = {
                "data-root": str(resolve_data_root()),
                "state-dir": str(tmp_path / f"state-{i}"),
                "he-key-dir": str(tmp_path / "keys"),
            }
            hosts.start(
                ns,
                launcher.supernode_command(
                    f"{LINK_IP}:{PORT}", i, 2, node, certs, True, 9094, waits, preload
                ),
                tmp_path,
                launcher.supernode_env(env, waits),
                tmp_path / f"supernode-{i}.log",
            )
        yield hosts, certs
    finally:
        hosts.close()
    remaining = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert hosts.prefix not in remaining


def _user_run(hosts: Hosts, certs, out: Path, *overrides: str) -> tuple[int, str]:
    root = private_tmpdir()
    proc = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            hosts.user,
            FEDSIM,
            "run",
            "hardware=deploy_remote",
            f"hardware.superlink={LINK_IP}:{PORT}",
            f"hardware.certificates={certs.folder}",
            "hardware.num_supernodes=2",
            f"results_dir={out}",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "TMPDIR": root},
    )
    return proc.returncode, proc.stdout + proc.stderr


def _figures(res: dict) -> dict:
    """Seconds and bytes per phase and round, as docs/benchmarks/deployment.md reports them."""
    return {
        phase: {
            r: {k: row[k] for k in ("seconds", "bytes_up", "bytes_down")}
            for r, row in rounds.items()
        }
        for phase, rounds in res["communication"].items()
        if isinstance(rounds, dict)
        and all(isinstance(row, dict) and "seconds" in row for row in rounds.values())
    }


@pytest.mark.exhaustive  # 3-4 min; by default tests/test_e2e_parity.py runs FedTP through a SuperLink
def test_fedtp_and_fede4rag_he_across_namespaces(federation, tmp_path):
    hosts, certs = federation
    code, log = _user_run(hosts, certs, tmp_path / "fedtp", *SMALL, "task.max_per_split=2")
    assert code == 0, log[-4000:]
    assert f"via SuperLink {LINK_IP}:{PORT} (TLS + node authentication)" in log
    res = read_results(tmp_path / "fedtp")  # shipped back through the log
    assert res["supernodes"] == 2 and res["prior_clients"]["nodes"] == 2
    print("netns fedtp", json.dumps(_figures(res)))

    code, log = _user_run(
        hosts,
        certs,
        tmp_path / "fede4rag",
        "experiment=fede4rag_paper",
        "task.companies=[AES Corporation,Boeing]",
        "task.pages_per_client=30",
        "task.n_valid=4",
        "task.n_test=6",
        "task.corpus_pages_per_doc=8",
        "num_rounds=1",
        "protocol.local_steps=2",
        "protocol.batch_size=4",
        "protocol.eval_pages_per_message=64",
        "~protocol.methods",
        "+protocol.methods={fede4rag: {run: fedsim_experiments.fede4rag.protocol.federated, kd_weight: 1.0, he: true}}",
    )
    assert code == 0, log[-4000:]
    res = read_results(tmp_path / "fede4rag")
    he = res["methods"]["fede4rag"]
    assert he["rounds"]["1"]["clients"] == 2 and he["rounds"]["1"]["chunk-failures"] == 0
    assert all(
        c["failed"] == c["timed_out"] == 0
        for phase in res["faults"].values()
        for c in phase.values()
    )
    print("netns fede4rag", json.dumps(_figures(res)))
