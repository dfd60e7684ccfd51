"""A small local PKI with ``cryptography``: one CA, an Edge server certificate, Node client
certificates (``manage.py iop_certs``, docs/node.md). Keys are EC P-256, written 0600."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from secretref.keyfiles import create_private

DEFAULT_DAYS = 825  # the longest lifetime clients commonly accept for a server certificate


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def write(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """Write ``stem.key`` (created exclusively, 0600, R-TLS-5) and ``stem.crt`` (0644);
        return both paths. ``PrivateFileError`` when the key file exists."""
        directory.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        key_bytes = self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        create_private(key_path, key_bytes)
        cert_path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return cert_path, key_path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _window(days: int, start: datetime.datetime | None) -> tuple[datetime.datetime, ...]:
    begin = (start or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    return begin, begin + datetime.timedelta(days=days)


def new_ca(
    common_name: str = "IOP local CA",
    *,
    days: int = 3650,
    start: datetime.datetime | None = None,
) -> Issued:
    """A self-signed CA that may sign leaf certificates only."""
    key = ec.generate_private_key(ec.SECP256R1())
    begin, end = _window(days, start)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert, key)


def _san(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def issue(
    ca: Issued,
    common_name: str,
    *,
    names: Iterable[str] = (),
    server: bool,
    days: int = DEFAULT_DAYS,
    start: datetime.datetime | None = None,
) -> Issued:
    """A leaf certificate signed by ``ca``: a server certificate for ``names`` (DNS names or
    IP addresses), or a client certificate for ``common_name``."""
    key = ec.generate_private_key(ec.SECP256R1())
    begin, end = _window(days, start)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(begin)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
    )
    san = _san(names)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return Issued(builder.sign(ca.key, hashes.SHA256()), key)


def load(cert_path: Path, key_path: Path) -> Issued:
    """Read back a certificate and its unencrypted key (to sign more with an existing CA)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: not an EC private key")
    return Issued(cert, key)
