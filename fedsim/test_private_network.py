"""A run's network namespace (fedsim/netns.py): what listens in it is out of reach from outside,
its processes keep the user's identity, and the launcher still sees their ports."""

import os
import socket
import subprocess
import sys

import pytest

from fedsim.netns import Namespace, NamespaceUnavailable, listening

SERVER = """
import os, socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], os.getuid(), os.getgid(), socket.gethostname(),
      [name for _, name in socket.if_nameindex()], flush=True)
socket.create_connection(server.getsockname()).close()  # its own loopback is up
sys.stdin.read()
"""


@pytest.fixture
def namespace():
    try:
        net = Namespace()
    except NamespaceUnavailable as exc:
        pytest.skip(f"no network namespace for this user here: {exc}")
    yield net
    net.close()


def test_a_port_in_the_namespace_is_out_of_reach_from_outside(namespace):
    server = subprocess.Popen(namespace.command([sys.executable, "-c", SERVER]), pass_fds=namespace.fds,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port, uid, gid, hostname, interfaces = server.stdout.readline().split(maxsplit=4)
        assert (int(uid), int(gid)) == (os.getuid(), os.getgid())  # file ownership reads the same
        assert interfaces.strip() == "['lo']" and hostname == "localhost"  # Ray's node address: loopback
        assert ("127.0.0.1", int(port)) in listening(server.pid)  # what the launcher waits on
        assert int(port) not in {p for _, p in listening(os.getpid())}
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(port)), timeout=5)
    finally:
        server.stdin.close()
        server.wait(10)


def test_listening_names_ipv4_and_ipv6_addresses():
    with socket.create_server(("127.0.0.1", 0)) as v4, \
            socket.create_server(("::1", 0), family=socket.AF_INET6) as v6, socket.socket() as idle:
        idle.bind(("127.0.0.1", 0))  # bound, not listening
        found = listening(os.getpid())
        assert ("127.0.0.1", v4.getsockname()[1]) in found and ("::1", v6.getsockname()[1]) in found
        assert idle.getsockname()[1] not in {p for _, p in found}
