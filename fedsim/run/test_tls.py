"""The test federation's certificates verify as Flower needs them; results survive shipping."""

import os
import random
import ssl
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from fedsim.results.outputs import ship_results, unpack_results
from fedsim.run.tls import Certificates, make_federation


def test_superlink_certificate_is_signed_by_the_ca_for_its_hosts(tmp_path):
    certs = make_federation(tmp_path, ["10.1.0.1", "superlink"], nodes=0)
    ca = x509.load_pem_x509_certificate(certs.ca.read_bytes())
    server = x509.load_pem_x509_certificate(certs.superlink_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.1.0.1"]
    assert san.get_values_for_type(x509.DNSName) == ["superlink"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert oct(certs.superlink_key.stat().st_mode)[-3:] == "600"


def test_node_keys_are_openssh_p384_pairs(tmp_path):
    certs = make_federation(tmp_path, ["127.0.0.1"], nodes=2)
    for i in range(2):
        private = load_ssh_private_key(certs.node_key(i).read_bytes(), password=None)
        public = load_ssh_public_key(certs.node_pub(i).read_bytes())
        assert isinstance(public.curve, ec.SECP384R1)
        assert private.public_key().public_numbers() == public.public_numbers()
    assert certs.node_pub(0).read_bytes() != certs.node_pub(1).read_bytes()


def test_missing_files_are_named(tmp_path):
    make_federation(tmp_path, ["127.0.0.1"], nodes=1)
    with pytest.raises(FileNotFoundError, match="node-1.key"):
        Certificates(tmp_path).check(nodes=2, server=True)
    (tmp_path / "superlink.key").unlink()
    with pytest.raises(FileNotFoundError, match="superlink.key"):
        Certificates(tmp_path).check(server=True)
    Certificates(tmp_path).check()  # a client needs the CA only


def test_results_survive_the_log_and_a_lost_chunk_is_refused(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "results.json").write_text('{"a": 1}')
    (src / "plot.png").write_bytes(random.Random(0).randbytes(20_000))  # incompressible
    lines = ship_results(src)
    assert len(lines) > 1  # several chunks
    unpack_results(lines, dst)
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == {
        p.name: p.read_bytes() for p in src.iterdir()
    }
    with pytest.raises(ValueError, match="incomplete"):
        unpack_results(lines[:-1], tmp_path / "lost")


def _handshake(certs: Certificates, host: str, strict: bool) -> None:
    """A TLS handshake in memory: a client trusting only the CA against the SuperLink's
    certificate. ``strict`` is Python 3.13's default verification (VERIFY_X509_STRICT)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(certs.superlink_cert, certs.superlink_key)
    client = ssl.create_default_context(cafile=str(certs.ca))
    if strict:
        client.verify_flags |= ssl.VERIFY_X509_STRICT
    bios = [ssl.MemoryBIO() for _ in range(4)]
    s_side = server.wrap_bio(bios[0], bios[1], server_side=True)
    c_side = client.wrap_bio(bios[2], bios[3], server_hostname=host)
    for _ in range(10):
        for side, out, into in ((c_side, bios[3], bios[0]), (s_side, bios[1], bios[2])):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
            into.write(out.read())
        if c_side.version() and s_side.version():
            return


@pytest.mark.parametrize("strict", [False, True])
def test_the_chain_verifies_under_strict_x509(tmp_path, strict):
    """Python 3.13 verifies strictly by default: a CA without key usage / key identifiers fails."""
    certs = make_federation(tmp_path / "certs", ["127.0.0.1", "superlink"], nodes=0)
    _handshake(certs, "superlink", strict)
    ca = x509.load_pem_x509_certificate(certs.ca.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs, "elsewhere", strict)  # the name is still checked


def test_private_keys_are_never_readable_by_others(tmp_path):
    """Created 0600 in a 0700 folder, even under a permissive umask (no chmod window)."""
    old = os.umask(0)
    try:
        certs = make_federation(tmp_path / "certs", ["127.0.0.1"], nodes=1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(certs.folder.stat().st_mode) == 0o700
    for key in (certs.superlink_key, certs.node_key(0)):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    open_folder = tmp_path / "shared"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    with pytest.raises(PermissionError):
        make_federation(open_folder, ["127.0.0.1"], nodes=0)
