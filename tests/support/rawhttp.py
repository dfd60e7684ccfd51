"""HTTP/1.1 on a raw socket, for clients that misbehave on purpose: headers and part of a
body now, the rest later (tests of R-IN-*, R-LIM-*). Every wait is bounded by the socket's
timeout; nothing here sleeps."""

from __future__ import annotations

import json
import selectors
import socket
import time
from typing import Any

MARGIN_S = 8.0  # the bound of every wait on a socket; never asserted as a time


def connect(port: int, timeout: float = MARGIN_S) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one response (Content-Length or chunked)."""
    return read_responses(sock, 1)[0]


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` responses in a row on one connection (pipelined requests' answers may
    share a read)."""
    data = b""
    out = []
    for _ in range(count):
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed before a response: {data!r}"
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        if headers.get("transfer-encoding") == "chunked":
            while b"0\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                assert chunk, "closed inside the body"
                data += chunk
            end = data.index(b"0\r\n\r\n") + 5
            body, data = unchunk(data[:end]), data[end:]
        else:
            length = int(headers.get("content-length", "0"))
            while len(data) < length:
                chunk = sock.recv(65536)
                assert chunk, "closed inside the body"
                data += chunk
            body, data = data[:length], data[length:]
        out.append((status, headers, body))
    return out


def unchunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out
        out, data = out + data[:size], data[size + 2 :]


def post_head(path: str, token: str, length: int) -> bytes:
    """The request line and headers of a JSON POST of ``length`` bytes with a bearer token."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


class SlowBody:
    """A POST whose headers and first body byte are sent at once and the rest on ``finish``:
    the request is authenticated and its body still arriving until then (R-LIM-1)."""

    def __init__(self, port: int, path: str, token: str, body: dict[str, Any]) -> None:
        self.payload = json.dumps(body).encode()
        self.sock = connect(port)
        self.sock.sendall(post_head(path, token, len(self.payload)) + self.payload[:1])

    def finish(self) -> tuple[int, dict[str, str], bytes]:
        """Send the rest of the body and read the answer."""
        self.sock.sendall(self.payload[1:])
        return read_response(self.sock)

    def answer_before_body(self) -> tuple[int, dict[str, str], bytes]:
        """The answer the Edge gave without waiting for the rest of the body."""
        return read_response(self.sock)

    def close(self) -> None:
        self.sock.close()


def first_answered(
    bodies: list[SlowBody], count: int, timeout: float = MARGIN_S
) -> dict[int, tuple[int, dict[str, str], bytes]]:
    """The answers of the first ``count`` of ``bodies`` the server answered before their
    bodies were sent, by index (bounded by ``timeout``): which ones the server refused at
    their headers, whatever order it read the connections in."""
    deadline = time.monotonic() + timeout
    out: dict[int, tuple[int, dict[str, str], bytes]] = {}
    with selectors.DefaultSelector() as selector:
        for index, body in enumerate(bodies):
            selector.register(body.sock, selectors.EVENT_READ, index)
        while len(out) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(out)} of {count} answered in {timeout} s"
            for key, _ in selector.select(left):
                selector.unregister(key.fileobj)
                out[key.data] = bodies[key.data].answer_before_body()
    return out
