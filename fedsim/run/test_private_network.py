"""A run's network namespace (fedsim/run/netns.py): what listens in it is out of reach from outside,
its processes keep the user's identity, and the launcher still sees their ports."""

import os
import platform
import socket
import subprocess
import sys

import pytest

from fedsim.results.provenance import HOST_ENV
from fedsim.run.netns import Namespace, NamespaceUnavailable, listening

SERVER = """
import os, socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], os.getuid(), os.getgid(), socket.gethostname(),
      [name for _, name in socket.if_nameindex()], flush=True)
socket.create_connection(server.getsockname()).close()  # its own loopback is up
sys.stdin.read()
"""


ENTER = """
import os, socket, sys
from fedsim.run.netns import KINDS, _same, join
pid, port = map(int, sys.argv[1:])
fds = [os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY) for kind in KINDS if not _same(kind, pid)]
join(fds, [sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)"])
"""


def _nobody():
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)


@pytest.fixture
def namespace():
    try:
        net = Namespace()
    except NamespaceUnavailable as exc:
        pytest.skip(f"no network namespace for this user here: {exc}")
    yield net
    net.close()


def test_a_port_in_the_namespace_is_out_of_reach_from_outside(namespace):
    server = subprocess.Popen(
        namespace.command([sys.executable, "-c", SERVER]),
        pass_fds=namespace.fds,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port, uid, gid, hostname, interfaces = server.stdout.readline().split(maxsplit=4)
        assert (int(uid), int(gid)) == (os.getuid(), os.getgid())  # file ownership reads the same
        assert (
            interfaces.strip() == "['lo']" and hostname == "localhost"
        )  # Ray's node address: loopback
        assert ("127.0.0.1", int(port)) in listening(server.pid)  # what the launcher waits on
        assert int(port) not in {p for _, p in listening(os.getpid())}
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", int(port)), timeout=5)
    finally:
        server.stdin.close()
        server.wait(10)


def test_the_runs_own_user_can_enter_the_namespace_another_user_cannot(namespace):
    """What the threat model says: a process of the run's user opens /proc/PID/ns/* and enters
    (as ``nsenter`` does; it holds every capability in the user namespace it owns); another uid
    may not open them (ptrace access), so not enter. The second half needs root to become another
    uid (nobody); it tries util-linux's ``nsenter``, what such a user would."""
    server = subprocess.Popen(
        namespace.command([sys.executable, "-c", SERVER]),
        pass_fds=namespace.fds,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = server.stdout.readline().split()[0]
        enter = [sys.executable, "-c", ENTER, str(server.pid), port]
        same = subprocess.run(enter, capture_output=True, text=True, timeout=60)
        assert same.returncode == 0, same.stderr
        if os.geteuid() != 0:
            pytest.skip("becoming another uid needs root")
        other = subprocess.run(
            ["nsenter", f"--target={server.pid}", "--net", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_nobody,
        )
        assert other.returncode != 0 and "Permission denied" in other.stderr, other.stderr
    finally:
        server.stdin.close()
        server.wait(10)


def test_listening_names_ipv4_and_ipv6_addresses():
    with (
        socket.create_server(("127.0.0.1", 0)) as v4,
        socket.create_server(("::1", 0), family=socket.AF_INET6) as v6,
        socket.socket() as idle,
    ):
        idle.bind(("127.0.0.1", 0))  # bound, not listening
        found = listening(os.getpid())
        assert ("127.0.0.1", v4.getsockname()[1]) in found and ("::1", v6.getsockname()[1]) in found
        assert idle.getsockname()[1] not in {p for _, p in found}


def test_a_module_planted_in_the_working_folder_is_not_run(tmp_path, monkeypatch):
    """The attack: another local user plants ``fedsim/run/netns.py`` in a shared folder (``/tmp``)
    the user starts ``fedsim run`` from; ``python -m`` put the working folder first on the path,
    so the namespace's maker ran the planted module as the user."""
    planted = tmp_path / "fedsim"
    planted.mkdir()
    (planted / "__init__.py").write_text("")
    (planted / "run").mkdir()
    (planted / "run" / "__init__.py").write_text("")
    (planted / "run" / "netns.py").write_text(f"open({str(tmp_path / 'owned')!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    try:
        Namespace().close()
    except NamespaceUnavailable:
        pass
    assert not (tmp_path / "owned").exists()


def test_a_run_in_the_namespace_records_the_machines_name(namespace):
    """The namespace names its host ``localhost`` (Ray's node address); results.json's provenance
    must still name the machine, as fedsim run hands it over (the e2e run recorded localhost)."""
    host = [
        sys.executable,
        "-c",
        "from fedsim.results.provenance import machine; print(machine()['host'])",
    ]
    env = {k: v for k, v in os.environ.items() if k != HOST_ENV}
    inside = subprocess.run(
        namespace.command(host),
        pass_fds=namespace.fds,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert inside.stdout.strip() == "localhost"  # without it
    given = subprocess.run(
        namespace.command(host),
        pass_fds=namespace.fds,
        capture_output=True,
        text=True,
        env={**env, HOST_ENV: platform.node()},
        check=True,
    )
    assert given.stdout.strip() == platform.node()


def test_a_helper_on_this_machines_network_is_refused(monkeypatch):
    """Were the helper's pid another process on this machine's network (the helper killed, its pid
    reused), the run would listen on the machine's network while saying it does not: refused."""
    import fedsim.run.netns as netns

    same = netns._same
    monkeypatch.setattr(netns, "_same", lambda kind, pid: kind == "net" or same(kind, pid))
    with pytest.raises(NamespaceUnavailable, match="on this process's network namespace"):
        Namespace()
