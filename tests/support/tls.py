"""Certificates minted in tests (never committed): a throwaway self-signed certificate, and a
``Pki`` (a CA, an Edge server certificate, Node client certificates) with bad variants."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from iop_site import certs
from secretref.keyfiles import create_private

LOOPBACK_NAMES = ("127.0.0.1", "localhost")


def self_signed(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """Write cert.pem/key.pem for 127.0.0.1; return the cert path and a server context."""
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.unlink(missing_ok=True)
    create_private(
        key_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return cert_path, context


@dataclass
class Pair:
    cert: Path
    key: Path


@dataclass
class Pki:
    """A CA in ``directory`` with an Edge certificate for loopback and lazily minted extras."""

    directory: Path
    ca: certs.Issued = field(default_factory=certs.new_ca)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = self.ca.write(self.directory, "ca")[0]
        self.edge = self.server("edge")

    def _pair(self, issued: certs.Issued, stem: str) -> Pair:
        (self.directory / f"{stem}.key").unlink(missing_ok=True)  # minted again: a new key
        return Pair(*issued.write(self.directory, stem))

    def server(self, stem: str, names: tuple[str, ...] = LOOPBACK_NAMES, **kw: object) -> Pair:
        return self._pair(certs.issue(self.ca, names[0], names=names, server=True, **kw), stem)  # type: ignore[arg-type]

    def client(self, node_id: str, **kw: object) -> Pair:
        return self._pair(certs.issue(self.ca, node_id, server=False, **kw), f"node-{node_id}")  # type: ignore[arg-type]

    # --- bad certificates, each refused by a verifying peer ---------------------------------

    def expired(self, *, server: bool) -> Pair:
        past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
        if server:
            return self.server("expired-server", start=past, days=1)
        return self._pair(
            certs.issue(self.ca, "expired", server=False, start=past, days=1), "expired-client"
        )

    def wrong_name(self) -> Pair:
        return self.server("wrong-name", names=("edge.example.invalid",))

    def wrong_ca(self, *, server: bool) -> Pair:
        other = certs.new_ca("another CA")
        names = LOOPBACK_NAMES if server else ()
        stem = "other-ca-server" if server else "other-ca-client"
        return self._pair(certs.issue(other, "other", names=names, server=server), stem)

    def self_signed(self, *, server: bool) -> Pair:
        """A certificate for loopback that signs itself (no CA at all)."""
        stem = "self-signed-server" if server else "self-signed-client"
        self_signed(self.directory / stem)
        return Pair(self.directory / stem / "cert.pem", self.directory / stem / "key.pem")

    def client_context(self, pair: Pair | None = None) -> ssl.SSLContext:
        """What a Node builds: trust this CA, present ``pair`` when given."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if pair is not None:
            context.load_cert_chain(pair.cert, pair.key)
        return context
