"""Certificates and node keys for a TLS federation with SuperNode authentication.

A real federation takes its certificates from the operator; a test federation (``hardware=
deploy_local``, the namespace and Docker tests, ``fedsim certs``) gets a private CA made here
with ``cryptography``: a SuperLink certificate signed by it for the given host names / IPs, and
one NIST P-384 key pair per SuperNode in OpenSSH format, which is what Flower 1.42's
``--auth-supernode-private-key`` and ``flwr supernode register`` read.

Private keys are created owner-only from their first byte (``O_EXCL``, mode 0600: no window in
which another user could open them) in a folder of mode 0700. Certificates carry subject and
authority key identifiers and key usage: Python 3.13 verifies with ``VERIFY_X509_STRICT`` by
default and refuses a chain without them.

Why not ``trustme`` (the usual test CA): it makes certificates for tests in memory and writes
their keys where it is told with the process's umask, and it makes no SuperNode key pairs; here
the same code serves ``deploy_local`` runs and ``fedsim certs``, whose keys must be owner-only
from their first byte and whose nodes need OpenSSH-format EC keys. The certificate part is a
few calls of ``cryptography``, which trustme itself wraps.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedsim.privacy.secret import create_private_file, private_folder
from fedsim.runtime.journal import key_fingerprint

VALID_DAYS = 30


@dataclass(frozen=True)
class Certificates:
    """The files of one federation, by role, in ``folder``."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def superlink_cert(self) -> Path:
        return self.folder / "superlink.pem"

    @property
    def superlink_key(self) -> Path:
        return self.folder / "superlink.key"

    def node_key(self, index: int) -> Path:
        return self.folder / f"node-{index}.key"

    def node_pub(self, index: int) -> Path:
        return self.folder / f"node-{index}.pub"

    def check(self, nodes: int = 0, server: bool = False) -> None:
        """Refuse a folder that lacks a file its role needs, naming it."""
        need = [self.ca] + ([self.superlink_cert, self.superlink_key] if server else [])
        need += [p for i in range(nodes) for p in (self.node_key(i), self.node_pub(i))]
        missing = [str(p) for p in need if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"certificate files missing: {', '.join(missing)} "
                f"(make a test set with `fedsim certs {self.folder}`)"
            )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    def entry(host: str):
        try:
            return x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            return x509.DNSName(host)

    return x509.SubjectAlternativeName([entry(h) for h in hosts])


def _key_usage(ca: bool) -> x509.KeyUsage:
    """A CA signs certificates (and CRLs); a server certificate signs its TLS handshake."""
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _certificate(
    subject: str, key, issuer: str, signer, days: int, ca: bool, hosts: list[str] = ()
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(_key_usage(ca), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False
        )
    )
    if hosts:
        builder = builder.add_extension(_san(list(hosts)), critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """A public file as usual; a private key as a new file of mode 0600 from its creation
    (never written through a link, never widened afterwards)."""
    if not private:
        path.write_bytes(data)
        return
    path.unlink(missing_ok=True)  # a key made again replaces the old one (a link: only the link)
    create_private_file(path, data)


def _pem_key(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_node_key(certs: Certificates, index: int) -> None:
    """A SuperNode's authentication key pair (OpenSSH, P-384)."""
    key = ec.generate_private_key(ec.SECP384R1())
    _write(
        certs.node_key(index),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        ),
        private=True,
    )
    _write(
        certs.node_pub(index),
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        + b"\n",
    )


def make_federation(
    folder: str | Path, hosts: list[str], nodes: int, days: int = VALID_DAYS
) -> Certificates:
    """A private CA, a SuperLink certificate for ``hosts`` and ``nodes`` node key pairs."""
    certs = Certificates(private_folder(Path(folder)))
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = _certificate("fedsim test CA", ca_key, "fedsim test CA", ca_key, days, ca=True)
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = _certificate(
        hosts[0], server_key, "fedsim test CA", ca_key, days, ca=False, hosts=hosts
    )
    _write(certs.ca, ca.public_bytes(serialization.Encoding.PEM))
    _write(certs.superlink_cert, server.public_bytes(serialization.Encoding.PEM))
    _write(certs.superlink_key, _pem_key(server_key), private=True)
    for i in range(nodes):
        make_node_key(certs, i)
    return certs


def partition_keys(certs: Certificates, nodes: int) -> str:
    """JSON: each SuperNode key's fingerprint -> its partition (``node-I.pub`` is partition I's,
    as the launcher starts SuperNode I with ``node-I.key``), for ``journal.NODE_KEYS_ENV``: the
    ServerApp holds a node's claim of a partition to the key the SuperLink authenticated it by."""
    return json.dumps({key_fingerprint(certs.node_pub(i).read_bytes()): i for i in range(nodes)})
