"""The test federation's certificates verify as Flower needs them; results survive shipping."""

import random

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key

from fedsim.results import ship_results, unpack_results
from fedsim.tls import Certificates, make_federation


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
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == {p.name: p.read_bytes() for p in src.iterdir()}
    with pytest.raises(ValueError, match="incomplete"):
        unpack_results(lines[:-1], tmp_path / "lost")
