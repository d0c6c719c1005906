"""``hardware=ray_cluster``: the simulation on a Ray cluster fedsim did not start. A two-node
cluster on this machine, started by the test as an operator would on two hosts (``ray start
--head`` on 127.0.0.1, a second raylet joining it from 127.0.0.2, each with its own HOME and
temporary folder and the environment its clients' folders come from: ``fedsim/config/node_local.py``),
runs the stateful 4-client, 3-round run of ``tests/test_e2e_client_state.py``: stopped by SIGTERM
while client 3 holds its round-2 reply, then resumed, it ends with the results of the same run
on Ray started by fedsim on one node; clients ran on both cluster nodes (the results'
provenance counts the clients per Ray node); fedsim's processes and its actors are gone, and the
cluster is up, both nodes alive (fedsim never stops a cluster it did not start). The test stops
the cluster by the pids of its two ``ray start --block`` processes.

Times (whole test, per phase): docs/deploy.md, on an existing Ray cluster."""

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from test_e2e_client_state import CLIENTS, HELD, RUN

from conftest import fedsim_run, kill_when, private_tmpdir, read_results, without_timings
from fedsim.config.data import resolve_data_root
from fedsim.run.launcher import BIN, free_port
from fedsim_clients.state_probe import HOLD_ENV, NAME

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODE = re.compile(
    r"^\s*1 node_([0-9a-f]+)$", re.MULTILINE
)  # `ray status`: one line per active node


def _ray(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "ray"), *args], capture_output=True, text=True, env=env, timeout=120
    )


def _nodes(address: str, env: dict) -> set[str]:
    """The cluster's active nodes, as ``ray status`` lists them."""
    return set(NODE.findall(_ray("status", f"--address={address}", env=env).stdout))


def _start(name: str, ip: str, root: Path, env: dict, *args: str) -> subprocess.Popen:
    """``ray start --block`` of one node: its processes are its children, and end with it."""
    with open(root / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            [
                str(BIN / "ray"),
                "start",
                "--block",
                f"--node-ip-address={ip}",
                "--num-cpus=1",
                f"--temp-dir={root / name}",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                *args,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def cluster(tmp_path):
    """A two-node Ray cluster: (its address, the operator's environment of its nodes, the ``ray
    start`` processes). Ray's folders live in a short folder of their own (its socket paths
    must stay under 107 characters); stopped and removed afterwards, nothing left."""
    root = Path(private_tmpdir())
    (tmp_path / "home").mkdir()
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "RAY_USAGE_STATS_ENABLED": "0",
        "FEDSIM_DATA_ROOT": str(resolve_data_root()),
        "FEDSIM_STATE_DIR": str(tmp_path / "state"),
        HOLD_ENV: f"{HELD}:2:{tmp_path / 'release'}",
    }
    address, starts = f"127.0.0.1:{free_port()}", []
    try:
        starts.append(
            _start(
                "head",
                "127.0.0.1",
                root,
                env,
                "--head",
                f"--port={address.split(':')[1]}",
                "--include-dashboard=false",
                "--disable-usage-stats",
            )
        )
        starts.append(_start("node", "127.0.0.2", root, env, f"--address={address}"))
        deadline = time.monotonic() + 120
        while len(_nodes(address, env)) < 2:
            assert all(s.poll() is None for s in starts) and time.monotonic() < deadline, (
                root / "head.log"
            ).read_text()[-2000:] + (root / "node.log").read_text()[-2000:]
            time.sleep(1)
        yield address, env, starts
    finally:
        nodes = _descendants(starts)
        for start in starts:
            start.send_signal(signal.SIGTERM)
        for start in starts:
            try:
                start.wait(60)
            except subprocess.TimeoutExpired:
                start.kill()
        _, left = psutil.wait_procs(
            nodes, timeout=30
        )  # `ray start --block` stops its node's processes
        for proc in left:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
        assert left == [], "the cluster's processes outlived `ray start --block`"


def test_a_run_on_an_existing_two_node_cluster_resumes_and_ends_as_on_its_own_ray(
    cluster, tmp_path, uninterrupted
):
    address, env, starts = cluster
    reference = (
        uninterrupted("one_per_node") / "results"
    )  # the same run on Ray started by fedsim, one node
    out, state, journal = (
        tmp_path / "results",
        tmp_path / "state",
        tmp_path / "results" / "checkpoint" / "journal",
    )

    def saved() -> bool:  # client 0 and the held client saved round 2 on the cluster
        return all(any(state.glob(f"run-*/client-{p}/{NAME}.r2.npz")) for p in (0, HELD))

    kill_when(
        [*RUN, "hardware=ray_cluster", f"hardware.ray_address={address}", f"results_dir={out}"],
        private_tmpdir(),
        lambda: saved() and len(list(journal.glob("*.exchange"))) >= 1,
        signal.SIGTERM,
    )
    assert len(list(journal.glob("*.exchange"))) == 1 and not (out / "results.json").exists()
    (tmp_path / "release").touch()
    code, log = fedsim_run(f"resume={out}")
    assert code == 0, log[-3000:]
    assert (
        f"clients on the Ray cluster at {address}" in log
        and "resume: replaying 1 journaled exchanges" in log
    )

    resumed, expected = read_results(out), read_results(reference)
    assert without_timings(resumed) == without_timings(expected)
    assert resumed["released"] == expected["released"]
    nodes = _nodes(address, env)
    assert (
        set(resumed["provenance"]["ray_nodes"]) == nodes and len(nodes) == 2
    )  # clients on both nodes
    assert (
        len(expected["provenance"]["ray_nodes"]) == 1
        and not set(expected["provenance"]["ray_nodes"]) & nodes
    )
    assert sum(resumed["provenance"]["ray_nodes"].values()) == CLIENTS
    assert sorted(p.name for p in next(state.glob("run-*")).iterdir()) == [
        f"client-{p}" for p in range(CLIENTS)
    ]
    # fedsim's actors end with its Ray driver (the job); the cluster's own processes stay
    deadline = time.monotonic() + 60
    while _client_actors(starts) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _client_actors(starts) == []
    assert all(s.poll() is None for s in starts) and _nodes(address, env) == nodes


def _descendants(starts: list[subprocess.Popen]) -> list[psutil.Process]:
    """Every live process the cluster's ``ray start`` processes started."""
    procs = []
    for start in starts:
        try:
            procs += psutil.Process(start.pid).children(recursive=True)
        except psutil.Error:
            pass
    return procs


def _client_actors(starts: list[subprocess.Popen]) -> list[int]:
    """The pids of fedsim's ClientApp actors among the cluster's processes."""
    return [p.pid for p in _descendants(starts) if _has_arg(p, "ClientAppActor")]


def _has_arg(proc: psutil.Process, text: str) -> bool:
    try:
        return any(text in arg for arg in proc.cmdline())
    except psutil.Error:
        return False
