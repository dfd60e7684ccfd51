"""Guards on daphne's Twisted HTTP channel (the Node and control listeners; the public one
has its own, ``iop_site.public_http``): what must happen before the ASGI app runs.

- R-IN-1: a body whose declared Content-Length (or chunked bytes so far) exceeds the limit
  is answered 413 ``request_too_large`` at once, before it is read or spooled to disk and
  before authentication, on every daphne HTTP listener.
- R-IN-5: a connection that has not sent complete request headers within the header
  deadline is closed (Twisted's idle timeout restarts on every byte, so it cannot do this).
- R-CTL-1: on the control listener, a request a web page could send (an ``Origin`` header, a
  foreign ``Host``, a ``POST /refresh`` that is not YAML or JSON) is answered 403 / 415 as
  soon as its headers are in, before its body is read (``edgekit.http``'s rules).
- R-IN-5: the channel's write side is exposed to the app as a ``WriteFlow`` (paused while
  the socket's write buffer is full), so the relay can stop pulling from the Node.
- Mutual TLS on the Node listener: the names of the client certificate a websocket peer
  presented (its subject's common names and DNS names) go into the scope, so the Node
  consumer refuses a Node whose certificate does not name its node id.

The hook points are Twisted's ``HTTPChannel`` (``connectionMade``, ``dataReceived``,
``allHeadersReceived``, ``pauseProducing``/``resumeProducing``) and ``Request``
(``handleContentChunk``); ``tests/test_twisted_guards.py`` fails if one moves.
See docs/architecture.md ("Hostile clients").
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID
from twisted.web import http

from edgekit.http import (
    CONTROL_CONTENT_TYPES,
    LINGER_S,
    UNSUPPORTED_REFRESH_BODY,
    browser_refusal,
    closing_answer,
    content_type,
    error_body,
)
from nodes.consumer import PEER_NAMES
from obskit.context import request_id_from
from pool.http.errors import error_json, request_too_large
from pool.http.relay import WRITE_FLOW

log = logging.getLogger("iop.edge")


class WriteFlow:
    """Whether the client's socket takes more output; the relay waits on ``writable``."""

    __slots__ = ("_waiter", "paused")

    def __init__(self) -> None:
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def writable(self, timeout_s: float) -> bool:
        """True once the client has read what was written; False after ``timeout_s``."""
        if not self.paused:
            return True
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._waiter)
        except TimeoutError:
            return False
        return True


class GuardedChannel(http.HTTPChannel):  # type: ignore[misc]
    """An ``HTTPChannel`` with a header deadline, an early body limit and a write flow."""

    max_body_bytes = 8 * 1024 * 1024  # set by ``install``
    header_timeout_s = 15.0
    control_port: int | None = None  # the control listener's port (R-CTL-1), by ``install``
    _iop_deadline: Any = None
    _iop_refused = False
    _iop_flow: WriteFlow | None = None

    # --- header deadline (R-IN-5) ------------------------------------------------------------

    def connectionMade(self) -> None:
        super().connectionMade()
        self._iop_arm(self.header_timeout_s)

    def dataReceived(self, data: bytes) -> None:
        if self._iop_refused:
            return  # answered 413: the rest is read and discarded until the linger ends
        if self._iop_deadline is None and self.line_mode and not self._handlingRequest:
            self._iop_arm(self.header_timeout_s)  # the first byte of the next request
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        self._iop_disarm()
        if self.length is not None and self.length > self.max_body_bytes:
            self.refuse_body()  # R-IN-1: from the declared length, before any body byte
            return
        if self.control_port is not None and self._iop_control_refusal():
            return  # R-CTL-1: a browser-shaped control request, answered before its body
        super().allHeadersReceived()

    def _iop_control_refusal(self) -> bool:
        """On the control listener, refuse what a web page could send (R-CTL-1) as soon as
        the headers are in: the body is never read. The ASGI app checks the same again."""
        host = self.transport.getHost() if self.transport is not None else None
        if host is None or getattr(host, "port", None) != self.control_port:
            return False
        request = self.requests[-1]
        scope = {
            "headers": [
                (name.lower(), value)
                for name, values in request.requestHeaders.getAllRawHeaders()
                for value in values
            ],
            "server": (host.host, host.port),
        }
        refusal = browser_refusal(scope)
        if refusal is not None:
            self._iop_answer(b"403 Forbidden", error_body("forbidden", refusal))
            return True
        path = (getattr(self, "_path", b"") or b"").split(b"?", 1)[0]
        command = getattr(self, "_command", b"")
        refresh = command == b"POST" and path == b"/refresh"
        if refresh and content_type(scope["headers"]) not in CONTROL_CONTENT_TYPES:
            self._iop_answer(b"415 Unsupported Media Type", UNSUPPORTED_REFRESH_BODY)
            return True
        return False

    def rawDataReceived(self, data: bytes) -> None:
        if not self._iop_refused:
            super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        if not self._iop_refused:
            super().allContentReceived()

    def connectionLost(self, reason: Any) -> None:
        self._iop_disarm()
        if self._iop_flow is not None:
            self._iop_flow.resume()
        super().connectionLost(reason)

    def _iop_arm(self, seconds: float) -> None:
        self._iop_disarm()
        self._iop_deadline = self.callLater(seconds, self._iop_expired)  # the factory's reactor

    def _iop_disarm(self) -> None:
        call, self._iop_deadline = self._iop_deadline, None
        if call is not None and call.active():
            call.cancel()

    def _iop_expired(self) -> None:
        self._iop_deadline = None
        if self.transport is not None:
            self.transport.abortConnection()

    # --- body limit (R-IN-1) -----------------------------------------------------------------

    def refuse_body(self) -> None:
        """Answer 413 in the caller's error shape and close, reading nothing more into memory."""
        path = getattr(self, "_path", b"") or b""
        err = request_too_large(self.max_body_bytes)
        body = error_json(err, anthropic=path.startswith(b"/v1/messages"))
        self._iop_answer(b"413 Request Entity Too Large", body)

    def _iop_answer(self, status: bytes, body: bytes | dict[str, Any]) -> None:
        """Answer ``status`` with a JSON body and close, discarding what the client sends."""
        if self._iop_refused or self.transport is None:
            return
        self._iop_refused = True
        if isinstance(body, dict):
            body = json.dumps(body, sort_keys=True).encode()
        self.transport.write(closing_answer(status, body, self._iop_request_id()))
        self.setTimeout(None)
        # Half-close: the answer and a FIN go out; what the client still sends is discarded
        # for a short while so its TCP stack does not reset the answer away, then abort.
        lose_write = getattr(self.transport, "loseWriteConnection", None)
        if lose_write is not None:
            lose_write()
        else:
            self.transport.loseConnection()
        self._iop_arm(LINGER_S)

    def _iop_request_id(self) -> str:
        """R-OBS-1: this refusal's request id, the caller's when it is a valid one."""
        request = self.requests[-1] if getattr(self, "requests", None) else None
        given = (
            request.requestHeaders.getRawHeaders(b"x-request-id", [None])[0]
            if request is not None
            else None
        )
        return request_id_from(given)

    # --- write flow (R-IN-5) -----------------------------------------------------------------

    def write_flow(self) -> WriteFlow:
        if self._iop_flow is None:
            self._iop_flow = WriteFlow()
            if self._waitingForTransport:
                self._iop_flow.pause()
        return self._iop_flow

    def pauseProducing(self) -> None:
        if self._iop_flow is not None:
            self._iop_flow.pause()
        super().pauseProducing()

    def resumeProducing(self) -> None:
        if self._iop_flow is not None:
            self._iop_flow.resume()
        super().resumeProducing()


def _guarded_request(base: type) -> type:
    class GuardedRequest(base):  # type: ignore[misc, valid-type]
        """Counts chunked body bytes as they are decoded (R-IN-1)."""

        iop_guarded = True
        _iop_received = 0

        def handleContentChunk(self, data: bytes) -> None:
            channel = self.channel
            if channel is None or getattr(channel, "_iop_refused", False):
                return
            self._iop_received += len(data)
            if self._iop_received > getattr(channel, "max_body_bytes", self._iop_received):
                channel.refuse_body()
                return
            super().handleContentChunk(data)

    return GuardedRequest


def _guarded_protocol(factory: Any) -> Any:
    return http._GenericHTTPChannelProtocol(GuardedChannel())


def install(
    *, max_body_bytes: int, header_timeout_s: float, control_port: int | None = None
) -> None:
    """Make daphne build guarded channels and requests; safe to call again (new limits)."""
    from daphne import http_protocol

    GuardedChannel.max_body_bytes = max_body_bytes
    GuardedChannel.header_timeout_s = header_timeout_s
    GuardedChannel.control_port = control_port
    if not getattr(http_protocol.WebRequest, "iop_guarded", False):
        # looked up by daphne's HTTPFactory.buildProtocol as a module global
        http_protocol.WebRequest = _guarded_request(http_protocol.WebRequest)
    http_protocol.HTTPFactory.protocol = _guarded_protocol


def attach_flow(protocol: Any, scope: dict[str, Any]) -> None:
    """Give an HTTP request's app its channel's ``WriteFlow`` (daphne builds the scope)."""
    channel = getattr(protocol, "channel", None)
    if isinstance(channel, GuardedChannel):
        scope.setdefault("extensions", {})[WRITE_FLOW] = channel.write_flow()


def attach_peer_names(protocol: Any, scope: dict[str, Any]) -> None:
    """Put the names of the client certificate a websocket peer presented into its scope
    (``PEER_NAMES``); nothing when the listener asks for none. daphne does not, and the TLS
    transport under its protocol has the certificate (``getPeerCertificate``)."""
    transport = getattr(protocol, "transport", None)
    peer = getattr(transport, "getPeerCertificate", None)
    found = peer() if peer is not None else None
    if found is not None:
        scope.setdefault("extensions", {})[PEER_NAMES] = certificate_names(found.to_cryptography())


def certificate_names(cert: x509.Certificate) -> list[str]:
    """The subject's common names, then the DNS names of its subjectAltName."""
    names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return names
    return names + [str(n) for n in san.get_values_for_type(x509.DNSName)]
