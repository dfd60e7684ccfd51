"""Big requests and slow readers through a real Edge, a real ``iop-node`` and a loopback
upstream: a 6 MiB image body reaches the upstream intact (R-IN-2), and a client that stops
reading holds at most ``stream_buffer_bytes`` on the Edge while the run slows (R-IN-5)."""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support import Stack

pytestmark = pytest.mark.slow

WINDOW = 65536  # openai.stream_buffer_bytes: the smallest allowed
MIB = 1024 * 1024
WAIT_S = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("large-slow"), openai={"stream_buffer_bytes": WINDOW}
    ) as stack:
        yield stack


def test_r_in_2_a_6_mib_image_body_reaches_the_upstream_intact(stack: Stack) -> None:
    """R-IN-2: larger than one websocket message (4 MiB): split on the wire, reassembled."""
    stack.reset_upstreams()
    image = "data:image/png;base64," + base64.b64encode(os.urandom(4_800_000)).decode()
    content = [
        {"type": "text", "text": "describe this"},
        {"type": "image_url", "image_url": {"url": image}},
    ]
    body = {"model": "gpt-test", "messages": [{"role": "user", "content": content}]}
    answer = httpx.post(
        stack.v1_url + "/chat/completions",
        headers={"authorization": f"Bearer {stack.token}"},
        json=body,
        timeout=WAIT_S,
    )
    assert answer.status_code == 200, answer.text
    (seen,) = stack.upstream().server.requests
    assert len(seen.body) > 6 * MIB
    received = seen.json
    assert received["model"] == "served-gpt"
    assert received["messages"][0]["content"][1]["image_url"]["url"] == image
    stack.wait_idle()


def _buffered(stack: Stack) -> tuple[int, int, int]:
    snap = stack.pool_snapshot()
    return (
        snap["relay_buffered_bytes"],
        snap["relay_buffered_bytes_max"],
        snap["relay_held_streams"],
    )


def test_r_in_5_a_client_that_stops_reading_holds_one_window_and_slows_the_run(
    stack: Stack,
) -> None:
    """R-IN-5: the Edge's own counter stays within the window while the client reads nothing,
    the upstream is held back before it has written the whole stream, and once the client
    reads again everything arrives in order."""
    stack.reset_upstreams()
    upstream = stack.upstream()
    word = "y" * 65535 + " "
    words = 24 * 16  # 24 MiB of stream
    upstream.call(_set(upstream.server, "reply_text", word * words))
    body = json.dumps(
        {"model": "gpt-test", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    try:
        sock.settimeout(WAIT_S)
        sock.connect(("127.0.0.1", stack.ports["openai"]))
        sock.sendall(
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer {stack.token}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )
        # The client's socket is full, the relay waits for it, and the Node has spent its
        # whole credit: the Edge holds one window and the upstream is held back mid-stream.
        stack.wait_until(
            lambda snap: (
                snap["relay_held_streams"] == 1 and snap["relay_buffered_bytes_max"] == WINDOW
            ),
            WAIT_S,
            "a held stream with one full window",
        )
        written = sum(len(r.response) for r in upstream.server.requests)
        assert written < len(word) * words
        # However the kernel's socket buffers drain and refill meanwhile, the Edge's own
        # buffer never passes the window while the client reads nothing.
        samples = [_buffered(stack) for _ in range(50)]
        assert max(total for total, _, _ in samples) <= WINDOW
        received = _read_to_end(sock)
    finally:
        sock.close()
        upstream.call(_set(upstream.server, "reply_text", "Hello from the fake upstream."))
    events = _unchunk(received.partition(b"\r\n\r\n")[2]).split(b"\n\n")
    text = "".join(
        choice["delta"].get("content") or ""
        for event in events
        if event.startswith(b"data: {")
        for choice in json.loads(event[6:])["choices"]
    )
    assert text == word * words  # every byte, in order
    assert events[-2] == b"data: [DONE]"
    stack.wait_idle()
    assert _buffered(stack) == (0, 0, 0)


def _read_to_end(sock: socket.socket) -> bytes:
    data = bytearray()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], deadline - time.monotonic())
        if not ready:
            break
        chunk = sock.recv(MIB)
        if not chunk:
            break
        data += chunk
        if data.endswith(b"\r\n0\r\n\r\n"):
            break
    return bytes(data)


def _unchunk(data: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(out)
        out += data[:size]
        data = data[size + 2 :]


async def _set(obj: object, name: str, value: object) -> None:
    setattr(obj, name, value)
