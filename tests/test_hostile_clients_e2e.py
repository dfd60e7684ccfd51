"""Clients that misbehave on the socket, through the real daphne listeners (raw sockets):
declared bodies over the limit, chunked bodies past it, headers sent one byte at a time or
half sent and then silence. Each test ends with the Edge still serving (R-IN-1, R-IN-5).
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import pytest

from tests.support import Stack
from tests.support.rawhttp import MARGIN_S, connect, read_response

pytestmark = pytest.mark.slow

LIMIT = 64 * 1024
HEADER_TIMEOUT_S = 2.0
CONNECTIONS = 50


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    openai = {"max_request_bytes": LIMIT, "header_timeout_s": HEADER_TIMEOUT_S}
    with Stack(tmp_path_factory.mktemp("hostile"), openai=openai) as stack:
        yield stack


def _closed_by_peer(sock: socket.socket) -> bool:
    """Wait (bounded) until the peer closes: EOF or reset; False if it stayed open."""
    deadline = time.monotonic() + HEADER_TIMEOUT_S + MARGIN_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], deadline - time.monotonic())
        if not ready:
            return False
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def _assert_too_large(status: int, body: bytes, anthropic: bool = False) -> None:
    assert status == 413
    doc = json.loads(body)
    if anthropic:
        assert doc["type"] == "error" and doc["error"]["type"] == "request_too_large"
    else:
        assert doc["error"]["code"] == "request_too_large"


def _still_serves(stack: Stack) -> None:
    import httpx

    answer = httpx.post(
        stack.v1_url + "/chat/completions",
        headers={"authorization": f"Bearer {stack.token}"},
        json={"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]},
        timeout=20,
    )
    assert answer.status_code == 200, answer.text
    stack.wait_idle()


@pytest.mark.parametrize(
    ("listener", "path", "anthropic"),
    [
        ("openai", "/v1/chat/completions", False),
        ("openai", "/v1/messages", True),
        ("openai", "/admin/login/", False),
        ("openai", "/api/revisions/", False),
        ("admin", "/refresh", False),
    ],
)
def test_r_in_1_a_declared_length_over_the_limit_is_refused_before_any_body_byte(
    stack: Stack, listener: str, path: str, anthropic: bool
) -> None:
    """R-IN-1: 1 GiB declared, no body and no credentials sent: the 413 comes at once."""
    with connect(stack.ports[listener]) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {1 << 30}\r\n\r\n".encode()
        )
        status, headers, body = read_response(sock)
        _assert_too_large(status, body, anthropic)
        assert headers["connection"] == "close"
        assert _closed_by_peer(sock)
    _still_serves(stack)


@pytest.mark.parametrize("credentials", [True, False], ids=["authenticated", "anonymous"])
def test_r_in_1_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(
    stack: Stack, credentials: bool
) -> None:
    """R-IN-1: chunks keep coming and never end; the 413 arrives while they still come. The
    public listener starts the app once the headers are in, so an anonymous caller may be
    answered 401 before its body reaches the limit: one answer either way, never a second
    one on the same connection."""
    chunk = b"x" * 8192
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    auth = f"Authorization: Bearer {stack.token}\r\n".encode() if credentials else b""
    with connect(stack.ports["openai"]) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            + auth
            + b"\r\n"
        )
        answered = False
        while sent < 64 * LIMIT:  # bounded: far more than the limit
            try:
                sock.sendall(framed)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            ready, _, _ = select.select([sock], [], [], 0)
            if ready and (credentials or sent > 2 * LIMIT):
                answered = True
                break
        # The last chunk is never sent: an answer at all means the body was refused while
        # it was still coming (how far the client got depends on the kernel's buffers).
        assert answered or sent < 64 * LIMIT
        if credentials:
            status, _, body = read_response(sock)
            _assert_too_large(status, body)
        else:  # past the limit: the connection ends, after exactly one answer
            received = _until_closed(sock)
            assert received.count(b"HTTP/1.1 ") == 1, received[:300]
            assert received.split(b" ", 2)[1] in (b"401", b"413")
    _still_serves(stack)


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (bounded)."""
    data = b""
    deadline = time.monotonic() + MARGIN_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], deadline - time.monotonic())
        if not ready:
            break
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return data
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the connection stayed open: {data[:300]!r}")


def test_r_in_5_connections_without_complete_headers_are_closed_at_the_deadline(
    stack: Stack,
) -> None:
    """R-IN-5: half of the connections send half their headers and go silent, the other half
    send one byte at a time (each byte restarts Twisted's idle timer); all are closed."""
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer nothing-yet\r\nContent-Type: application/json\r\n"
    )
    silent = [connect(stack.ports["openai"]) for _ in range(CONNECTIONS // 2)]
    for sock in silent:
        sock.sendall(request[: len(request) // 2])
    dribbling = [connect(stack.ports["openai"]) for _ in range(CONNECTIONS - len(silent))]
    sent = dict.fromkeys(dribbling, 0)
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + HEADER_TIMEOUT_S + MARGIN_S
    try:
        while len(closed) < len(dribbling) and time.monotonic() < deadline:
            for sock in dribbling:
                if sock in closed:
                    continue
                try:
                    sock.sendall(request[sent[sock] % len(request) :][:1])
                    sent[sock] += 1
                except (BrokenPipeError, ConnectionResetError):
                    closed.add(sock)
                    continue
                ready, _, _ = select.select([sock], [], [], 0)
                if ready and _closed_by_peer(sock):
                    closed.add(sock)
            select.select([], [], [], 0.05)  # one byte per connection per 50 ms
        assert closed == set(dribbling), f"{len(dribbling) - len(closed)} dribblers still open"
        assert all(sent[sock] < len(request) for sock in dribbling)  # never completed headers
        still_open = [sock for sock in silent if not _closed_by_peer(sock)]
        assert still_open == []
    finally:
        for sock in silent + dribbling:
            sock.close()
    _still_serves(stack)


def test_r_in_5_a_keep_alive_connection_is_not_cut_while_idle_between_requests(
    stack: Stack,
) -> None:
    """R-IN-5: the deadline covers headers, not the idle time before the next request."""
    request = (
        f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.token}\r\n\r\n"
    ).encode()
    with connect(stack.ports["openai"]) as sock:
        sock.sendall(request)
        assert read_response(sock)[0] == 200
        ready, _, _ = select.select([sock], [], [], HEADER_TIMEOUT_S + 1.0)
        assert ready == []  # idle past the header deadline, and not closed
        sock.sendall(request)
        status, _, body = read_response(sock)
        assert status == 200 and json.loads(body)["data"][0]["id"] == "gpt-test"
