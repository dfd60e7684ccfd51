"""TLS on the Edge's listeners (R-TLS-1): certificate options built in code, one endpoint each.

A listener with ``tls`` is served over TLS 1.2+ with forward-secret AEAD ciphers only; with
``client_ca_file`` every client must present a certificate signed by that CA (mutual TLS).
Files are read once, before anything listens: a missing or unreadable file refuses the start
naming the config path and the file (docs/configuration.md).
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from catalog.config import EdgeSnapshot, HostPort, TLSFiles
from secretref.keyfiles import PrivateFileError, check_private

_BACKLOG = 1024  # Twisted's default is 50 (docs/performance.md)
# TLS 1.2 suites: forward-secret AEAD only (TLS 1.3 suites are all of that kind already).
MODERN_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:DHE+AESGCM:DHE+CHACHA20:!aNULL:!eNULL"


class TLSFileError(Exception):
    """A configured certificate, key or CA file cannot be used; ``str`` names path and file."""


@dataclass(frozen=True, slots=True)
class Listener:
    """One listening socket: where, and its TLS files (None: plain TCP)."""

    role: str  # edge | admin | openai
    listen: HostPort
    tls: TLSFiles | None = None

    @property
    def secure(self) -> bool:
        return self.tls is not None

    def url(self) -> str:
        """How a client reaches it: wss:// or ws:// for the Node listener, else https:// or http://."""
        scheme = (
            ("wss" if self.secure else "ws")
            if self.role == "edge"
            else ("https" if self.secure else "http")
        )
        return f"{scheme}://{self.listen}"


def _read(path: str, where: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise TLSFileError(f"{where}: cannot read {path} ({exc.strerror})") from None


def _certs(path: str, where: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(_read(path, where))
    except ValueError:
        raise TLSFileError(f"{where}: {path} holds no PEM certificate") from None
    return certs


def certificate_options(tls: TLSFiles, where: str) -> Any:
    """Twisted ``CertificateOptions`` for one listener; ``where`` is its config path."""
    from OpenSSL import crypto
    from twisted.internet import ssl

    chain = _certs(tls.cert_file, f"{where}.cert_file")
    try:
        key = serialization.load_pem_private_key(
            _read(tls.key_file, f"{where}.key_file"), password=None
        )
    except (ValueError, TypeError):
        raise TLSFileError(
            f"{where}.key_file: {tls.key_file} holds no unencrypted PEM private key"
        ) from None
    try:  # R-TLS-5: a private key others can read is refused, with the fix
        check_private(tls.key_file, f"{where}.key_file")
    except PrivateFileError as exc:
        raise TLSFileError(str(exc)) from None
    options: dict[str, Any] = {}
    if tls.client_ca_file is not None:
        cas = _certs(tls.client_ca_file, f"{where}.client_ca_file")
        options = {
            "verify": True,
            "requireCertificate": True,
            "caCerts": [crypto.X509.from_cryptography(ca) for ca in cas],
        }
    try:
        built = ssl.CertificateOptions(
            privateKey=crypto.PKey.from_cryptography_key(key),  # type: ignore[arg-type]
            certificate=crypto.X509.from_cryptography(chain[0]),
            extraCertChain=[crypto.X509.from_cryptography(c) for c in chain[1:]],
            raiseMinimumTo=ssl.TLSVersion.TLSv1_2,
            acceptableCiphers=ssl.AcceptableCiphers.fromOpenSSLCipherString(MODERN_CIPHERS),
            **options,
        )
        built.getContext()  # built lazily otherwise: a key that does not match fails here
        return built
    except Exception as exc:  # pyOpenSSL: the key does not match the certificate, etc.
        raise TLSFileError(
            f"{where}: {tls.cert_file} and {tls.key_file} cannot be used together "
            f"({type(exc).__name__})"
        ) from None


def server_context(tls: TLSFiles, where: str) -> ssl.SSLContext:
    """The standard library's context for the public listener (iop_site/public_http.py), with
    the same files, checks, versions and ciphers as ``certificate_options``."""
    certificate_options(tls, where)  # every refusal, worded as for the other listeners
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(MODERN_CIPHERS)
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=tls.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSFileError(
            f"{where}: {tls.cert_file} and {tls.key_file} cannot be used together "
            f"({type(exc).__name__})"
        ) from None
    return context


def _plain(listen: HostPort) -> str:
    host = listen.host.strip("[]").replace(":", r"\:")
    return f"tcp:port={listen.port}:interface={host}:backlog={_BACKLOG}"


class Endpoints:
    """The endpoint descriptions daphne is given, and the TLS endpoints they stand for; the
    public listener (role ``openai``) is not daphne's: ``public`` and ``public_ssl`` are what
    ``iop_site.public_http`` serves.

    daphne turns each description into an endpoint with ``serverFromString``, which has no
    syntax for a client CA. TLS listeners get a private description that ``resolve`` maps to
    an ``SSL4ServerEndpoint`` built here; every other description goes to Twisted as is.
    """

    _ids = itertools.count(1)

    def __init__(self, listeners: list[Listener]) -> None:
        self.listeners = listeners
        self.descriptions: list[str] = []
        self._tls: dict[str, tuple[Listener, Any]] = {}
        self.public: Listener | None = None
        self.public_ssl: ssl.SSLContext | None = None
        for listener in listeners:
            if listener.role == "openai":
                self.public = listener
                if listener.tls is not None:
                    self.public_ssl = server_context(listener.tls, "openai.tls")
                continue
            if listener.tls is None:
                self.descriptions.append(_plain(listener.listen))
                continue
            options = certificate_options(listener.tls, f"{listener.role}.tls")
            name = f"iop-tls-{next(self._ids)}"
            self._tls[name] = (listener, options)
            self.descriptions.append(name)

    def resolve(self, original: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
        """A ``serverFromString`` that knows this object's TLS descriptions."""
        from twisted.internet.endpoints import SSL4ServerEndpoint

        def server_from_string(reactor: Any, description: str) -> Any:
            found = self._tls.get(description)
            if found is None:
                return original(reactor, description)
            listener, options = found
            return SSL4ServerEndpoint(
                reactor,
                listener.listen.port,
                options,
                backlog=_BACKLOG,
                interface=listener.listen.host.strip("[]"),
            )

        return server_from_string

    def install(self) -> None:
        """Point daphne at ``resolve``: ``daphne.server.Server.run`` looks the name up in its
        module on each start (a test fails if that hook point moves)."""
        import daphne.server

        original = getattr(daphne.server, "_iop_original_server_from_string", None)
        if original is None:
            original = daphne.server.serverFromString
            daphne.server._iop_original_server_from_string = original  # type: ignore[attr-defined]
        daphne.server.serverFromString = self.resolve(original)


def listeners(snapshot: EdgeSnapshot) -> list[Listener]:
    """The Edge's listeners in start order: Nodes, the loopback admin, then the public API."""
    found = [
        Listener("edge", snapshot.edge_listen, snapshot.edge_tls),
        Listener("admin", snapshot.admin_listen),
    ]
    if snapshot.openai_enabled:
        found.append(Listener("openai", snapshot.openai_listen, snapshot.openai_tls))
    return found
