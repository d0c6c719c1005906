"""A network namespace of the run's own: what a run listens on exists for its processes alone.

Flower 1.42 authenticates no local client: its SuperLink serves the Control, ServerAppIo and
Fleet APIs on one TCP port (TLS proves the server, never the client; account authentication is
an enterprise plugin), a SuperNode serves its ClientAppIo API on another, and Ray opens its GCS,
raylet and worker ports, some on every interface. On the machine's network any local user could
list the run, start a ServerApp of its own as the run's user, or claim the run's tasks. In a
network namespace made for the run, with nothing but its own loopback, those ports are reachable
from the run's processes only (docs/architecture.md, threat model).

``python -m fedsim.run.netns create`` makes the namespace (inside a user namespace of its own unless
run as root: an unprivileged user holds CAP_NET_ADMIN only there; the user's uid and gid map to
themselves, so file ownership reads the same inside), brings its loopback up, prints ``ready``
and waits for EOF on stdin while :class:`Namespace` opens the namespaces through /proc.
``python -m fedsim.run.netns join FD... -- CMD...`` enters the namespaces open on FDs and execs CMD.

Written on libc's ``unshare`` and ``setns`` through ctypes: Python 3.11 has neither (``os.unshare``
is 3.12+), and util-linux's ``unshare`` maps the current user only from 2.38 and cannot bring a
loopback up after dropping its capabilities.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import sys

CLONE_NEWUTS, CLONE_NEWUSER, CLONE_NEWNET = 0x04000000, 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
KINDS = ("user", "uts", "net")  # the order a process must enter them in
# -P: not the working folder first on the path (``python -m``'s default), where another local user
# may have planted a ``fedsim`` package (``fedsim run`` started from /tmp)
MODULE = (sys.executable, "-P", "-m", "fedsim.run.netns")


class NamespaceUnavailable(RuntimeError):
    """This machine refuses a network namespace to this user (a kernel or security policy)."""


def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def create() -> None:
    """Move this process into a new network namespace (and user namespace unless root) with its
    loopback up."""
    uid, gid, root = os.getuid(), os.getgid(), os.geteuid() == 0
    _libc_call("unshare", CLONE_NEWNET | CLONE_NEWUTS | (0 if root else CLONE_NEWUSER))
    if not root:
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as fh:
                fh.write(text)
    _loopback_up()
    socket.sethostname("localhost")


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone
        return inodes
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def listening(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses (ip, port) process ``pid`` listens on, read from its own network
    namespace's tables (/proc/PID/net/tcp, tcp6); psutil reads only the caller's namespace's."""
    inodes, found = socket_inodes(pid), []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{table}") as fh:
                rows = [line.split() for line in fh.readlines()[1:]]
        except OSError:
            continue
        for row in rows:  # sl local_address rem_address st ... inode
            if row[3] == "0A" and row[9] in inodes:  # 0A: LISTEN
                address, port = row[1].split(":")
                raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
                ip = socket.inet_ntop(
                    family, b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                )
                found.append((ip, int(port, 16)))
    return found


class Host:
    """The machine's own network: commands run as given (a remote SuperLink, or
    ``hardware.private_network=false``)."""

    fds: tuple[int, ...] = ()

    def command(self, cmd: list[str]) -> list[str]:
        return cmd

    def close(self) -> None:
        pass


HOST = Host()


def _same(kind: str, pid: int) -> bool:
    mine, theirs = os.stat(f"/proc/self/ns/{kind}"), os.stat(f"/proc/{pid}/ns/{kind}")
    return (mine.st_dev, mine.st_ino) == (theirs.st_dev, theirs.st_ino)


class Namespace(Host):
    """A private network namespace, held open by this object's file descriptors: :meth:`command`
    runs a command in it (pass :attr:`fds` to the child). It ends once closed and its last
    process has exited."""

    def __init__(self):
        maker = subprocess.Popen(
            [*MODULE, "create"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            if maker.stdout.readline() != b"ready\n":
                maker.wait()
                raise NamespaceUnavailable(maker.stderr.read().decode().strip())
            kinds = [kind for kind in KINDS if not _same(kind, maker.pid)]
            if (
                "net" not in kinds
            ):  # e.g. the helper's pid taken by a process on this machine's network
                raise NamespaceUnavailable(
                    f"process {maker.pid} is on this process's network namespace"
                )
            self.fds = tuple(os.open(f"/proc/{maker.pid}/ns/{kind}", os.O_RDONLY) for kind in kinds)
        finally:
            maker.stdin.close()
            maker.wait()
            maker.stdout.close()
            maker.stderr.close()

    def command(self, cmd: list[str]) -> list[str]:
        return [*MODULE, "join", *map(str, self.fds), "--", *cmd]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = ()


def join(fds: list[int], cmd: list[str]) -> None:
    for fd in fds:
        _libc_call("setns", fd, 0)
        os.close(fd)
    os.execvp(cmd[0], cmd)


def main(argv: list[str]) -> None:
    if argv[0] == "create":
        try:
            create()
        except OSError as exc:
            sys.exit(f"fedsim.run.netns: {exc}")
        print("ready", flush=True)
        sys.stdin.buffer.read()  # the namespace is held by whoever opened it meanwhile
    elif argv[0] == "join":
        split = argv.index("--")
        join([int(fd) for fd in argv[1:split]], argv[split + 1 :])


if __name__ == "__main__":
    main(sys.argv[1:])
