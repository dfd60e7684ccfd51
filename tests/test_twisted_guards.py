"""The Twisted hook points the Edge's guards rely on (R-IN-1, R-IN-5), driven in memory.

Each test fails if Twisted moves the hook its guard patches: the declared length reaching
``allHeadersReceived``, decoded chunks reaching ``Request.handleContentChunk``, the
transport pausing the channel, and a deadline armed on connection.
"""

from __future__ import annotations

import json

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.web import http

from iop_site.twisted_guards import GuardedChannel, WriteFlow, _guarded_request

LIMIT = 1024


def _channel() -> tuple[GuardedChannel, StringTransport, Clock]:
    clock = Clock()
    channel = GuardedChannel()
    channel.max_body_bytes = LIMIT
    channel.header_timeout_s = 5.0
    channel.requestFactory = _guarded_request(http.Request)
    channel.callLater = clock.callLater
    transport = StringTransport()
    channel.makeConnection(transport)
    return channel, transport, clock


def test_r_in_1_a_declared_length_over_the_limit_is_answered_before_a_body_file_exists() -> None:
    """R-IN-1: 413 from the Content-Length alone; the request never gets a content file."""
    channel, transport, _ = _channel()
    channel.dataReceived(
        b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"
    )
    assert transport.value().startswith(b"HTTP/1.1 413 ")
    body = transport.value().partition(b"\r\n\r\n")[2]
    assert json.loads(body)["error"]["type"] == "request_too_large"  # Anthropic shape
    assert channel.requests[-1].content is None
    channel.dataReceived(b"x" * 4096)  # discarded, never buffered
    assert channel.requests[-1].content is None


def test_a_413_from_the_guard_carries_a_request_id_r_obs_1() -> None:
    """R-OBS-1: the refusal made before the app runs carries x-request-id too: the caller's
    valid one, else a new one."""
    for given, expected in ((b"caller-413", b"caller-413"), (b"bad id", None)):
        channel, transport, _ = _channel()
        channel.dataReceived(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: " + given
            + b"\r\nContent-Length: 99999999\r\n\r\n"
        )  # fmt: skip
        head = transport.value().partition(b"\r\n\r\n")[0].split(b"\r\n")
        (line,) = [h for h in head if h.lower().startswith(b"x-request-id: ")]
        value = line.split(b": ", 1)[1]
        assert value == expected if expected else (len(value) == 24 and value != given)


def test_r_in_1_chunked_bytes_are_counted_as_they_are_decoded() -> None:
    """R-IN-1: the 413 comes with the chunk that passes the limit, before the body ends."""
    channel, transport, _ = _channel()
    channel.dataReceived(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    channel.dataReceived(b"200\r\n" + b"a" * 512 + b"\r\n")
    assert transport.value() == b""
    channel.dataReceived(b"400\r\n" + b"a" * 1024 + b"\r\n")
    assert transport.value().startswith(b"HTTP/1.1 413 ")
    assert json.loads(transport.value().partition(b"\r\n\r\n")[2])["error"]["code"] == (
        "request_too_large"
    )
    channel.dataReceived(b"0\r\n\r\n")  # the end of the body no longer starts a request
    content = channel.requests[-1].content
    assert content.tell() == 512
    content.close()  # chunked bodies within the limit spool to a temp file, as before


def test_r_in_5_the_header_deadline_is_armed_on_connection_and_ends_it() -> None:
    """R-IN-5: bytes keep arriving but the headers never complete: aborted at the deadline."""
    channel, transport, clock = _channel()
    for _ in range(4):
        clock.advance(1.0)
        channel.dataReceived(b"X")
    assert not transport.disconnecting
    clock.advance(1.5)
    assert transport.disconnecting or transport.disconnected


def test_r_in_5_complete_headers_cancel_the_deadline() -> None:
    """R-IN-5: ``allHeadersReceived`` is where the header deadline ends."""
    channel, transport, clock = _channel()
    channel.dataReceived(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
    clock.advance(60.0)
    assert not transport.disconnecting


def test_r_in_5_the_transport_pausing_the_channel_pauses_the_write_flow() -> None:
    """R-IN-5: Twisted's transport tells the channel its write buffer is full; the relay's
    ``WriteFlow`` follows (``pauseProducing``/``resumeProducing``)."""
    channel, _, _ = _channel()
    flow = channel.write_flow()
    assert isinstance(flow, WriteFlow) and not flow.paused
    channel.pauseProducing()
    assert flow.paused and channel._waitingForTransport
    channel.resumeProducing()
    assert not flow.paused


def test_r_in_1_http2_is_not_offered_so_every_connection_gets_the_guarded_channel() -> None:
    """R-IN-1: with the ``h2`` package Twisted would negotiate HTTP/2 over TLS and bypass
    ``GuardedChannel``; installing it needs guards for that path first."""
    assert not http.H2_ENABLED


def _control_channel(port: int) -> tuple[GuardedChannel, StringTransport]:
    channel, transport, _ = _channel()
    channel.control_port = 7701
    transport.hostAddr = IPv4Address("TCP", "127.0.0.1", port)
    return channel, transport


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (b"Host: 127.0.0.1:7701\r\nOrigin: http://evil.example\r\nContent-Type: text/plain", 403),
        (b"Host: evil.example:7701\r\nContent-Type: application/yaml", 403),
        (b"Host: localhost:7701\r\nContent-Type: text/plain", 415),
        (b"Host: 127.0.0.1:7701\r\nContent-Type: application/x-www-form-urlencoded", 415),
    ],
)
def test_r_ctl_1_a_browser_shaped_control_request_is_answered_before_its_body(
    headers: bytes, status: int
) -> None:
    """R-CTL-1: on the control listener's port, an Origin header, a foreign Host or a body a
    page can send without a preflight is answered 403 / 415 from the headers alone; the
    request never gets a body and never reaches the app."""
    channel, transport = _control_channel(7701)
    channel.dataReceived(
        b"POST /refresh?mode=stage HTTP/1.1\r\n" + headers + b"\r\nContent-Length: 64\r\n\r\n"
    )
    assert transport.value().startswith(b"HTTP/1.1 %d " % status)
    code = json.loads(transport.value().partition(b"\r\n\r\n")[2])["error"]["code"]
    assert code == ("forbidden" if status == 403 else "unsupported_media_type")
    channel.dataReceived(b"x" * 64)  # discarded
    assert channel.requests[-1].content is None


def test_r_ctl_1_a_curl_shaped_control_request_and_other_listeners_pass() -> None:
    """R-CTL-1: curl's request (own Host, YAML) goes on to the app; the same browser headers
    on another listener's port are not the control guard's business."""
    channel, transport = _control_channel(7701)
    channel.dataReceived(
        b"POST /refresh?mode=dry_run HTTP/1.1\r\nHost: 127.0.0.1:7701\r\n"
        b"Content-Type: application/yaml\r\nContent-Length: 2\r\n\r\n"
    )
    assert transport.value() == b"" and channel.requests[-1].content is not None
    channel, transport = _control_channel(8080)
    channel.dataReceived(
        b"POST /admin/login/ HTTP/1.1\r\nHost: edge.example\r\nOrigin: https://edge.example\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 2\r\n\r\n"
    )
    assert transport.value() == b"" and channel.requests[-1].content is not None


def test_a_websocket_peers_client_certificate_names_reach_its_scope(tmp_path) -> None:
    """Mutual TLS on the Node listener: the certificate's common name and DNS names go into
    the scope (the consumer compares them with the node id); a plain or certificate-less
    transport adds nothing."""
    from types import SimpleNamespace

    from OpenSSL import crypto

    from iop_site import certs
    from iop_site.twisted_guards import attach_peer_names
    from nodes.consumer import PEER_NAMES

    ca = certs.new_ca("test CA")
    leaf = certs.issue(ca, "gpu-1", names=["gpu-1.example"], server=False)
    peer = crypto.X509.from_cryptography(leaf.cert)
    scope: dict = {}
    with_cert = SimpleNamespace(transport=SimpleNamespace(getPeerCertificate=lambda: peer))
    attach_peer_names(with_cert, scope)
    assert scope["extensions"][PEER_NAMES] == ["gpu-1", "gpu-1.example"]
    for transport in (SimpleNamespace(), SimpleNamespace(getPeerCertificate=lambda: None)):
        bare: dict = {}
        attach_peer_names(SimpleNamespace(transport=transport), bare)
        assert bare == {}
