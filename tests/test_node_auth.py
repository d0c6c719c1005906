"""SuperNode authentication over TLS: a registered SuperNode joins, an unregistered one is
refused (Flower 1.42 ``--enable-supernode-auth``, ``flwr supernode register``)."""

import json
import time
import uuid

import pytest

from fedsim.run import launcher
from fedsim.run.tls import make_federation

pytestmark = pytest.mark.e2e


def _online(env, cwd) -> list[str]:
    res = launcher._flwr(["supernode", "list", "fedsim", "--format", "json"], env, cwd)
    return [n["node-id"] for n in json.loads(res.stdout)["nodes"] if n["status"] == "online"]


def test_registered_node_joins_unregistered_node_is_refused(tmp_path):
    home = tmp_path / "flwr_home"
    home.mkdir()
    env = launcher._env(home, uuid.uuid4().hex)
    certs = make_federation(tmp_path / "certs", ["127.0.0.1"], nodes=2)
    link, port = launcher.start_superlink(tmp_path, env, False, certs, node_auth=True)
    with link:
        launcher.write_connection(home, f"127.0.0.1:{port}", certs)
        res = launcher._flwr(
            ["supernode", "register", str(certs.node_pub(0)), "fedsim", "--format", "json"],
            env,
            tmp_path,
        )
        registered = json.loads(res.stdout)["node-id"]
        good, bad = launcher.start_supernodes(
            tmp_path, env, port, 2, {"data-root": str(tmp_path)}, certs, True
        )
        with good, bad:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and (bad.alive() or not _online(env, tmp_path)):
                time.sleep(0.5)
            assert _online(env, tmp_path) == [str(registered)]
            assert good.alive()
            assert not bad.alive() and bad.proc.returncode != 0
            assert "Failed to activate SuperNode" in bad.log.read_text()
        assert not list(
            tmp_path.glob("*.db*")
        )  # registrations included, the local SuperLink's state is in memory
