"""The benchmark's upstream: a raw asyncio HTTP/1.1 server answering every POST at once.

Non-stream requests get a fixed chat.completion JSON; requests whose body asks for
``"stream": true`` get a fixed SSE stream of ``EVENTS`` events (one chunk each).
Kept free of frameworks so it is never the bottleneck of what it measures.
Run: ``python scripts/bench_upstream.py [--port N]``; the port is printed on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal

EVENTS = 20  # data events per stream, the final "[DONE]" included


def _chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "bench-served",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _sse_events(events: int) -> list[bytes]:
    """A streamed answer of ``events`` data events, the final "[DONE]" included."""
    return (
        [_chunk({"role": "assistant", "content": ""})]
        + [_chunk({"content": f"tok{i} "}) for i in range(events - 3)]
        + [_chunk({}, "stop"), b"data: [DONE]\n\n"]
    )


def _http_chunks(events: list[bytes]) -> list[bytes]:
    return [b"%x\r\n%s\r\n" % (len(event), event) for event in events]


SSE_EVENTS = _sse_events(EVENTS)
SSE_CHUNKS = _http_chunks(SSE_EVENTS)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
SSE_TAIL = b"0\r\n\r\n"
JSON_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "bench-served",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "pong"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    },
    separators=(",", ":"),
).encode()
MODELS_BODY = json.dumps(
    {"object": "list", "data": [{"id": "bench-served", "object": "model"}]}, separators=(",", ":")
).encode()
STREAM_RE = re.compile(rb'"stream"\s*:\s*true')
HOLD = b"bench-hold"  # a message holding this: the stream's first event, then nothing until
# the client leaves (open streams, scripts/bench_streams.py)
FRAMES = b"bench-frames"  # a message holding this: a stream of FRAME_EVENTS events written
# back to back (the added delay per streamed frame, scripts/bench_frames.py)
FRAME_EVENTS = 1000
FRAME_CHUNKS = _http_chunks(_sse_events(FRAME_EVENTS))


def _response(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


class UpstreamProtocol(asyncio.Protocol):
    """One keep-alive connection; requests are answered in arrival order."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self._one_request():
            pass

    def _one_request(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = self.buffer[:end].lower()
        rest = self.buffer[end + 4 :]
        if b"transfer-encoding: chunked" in head:
            body, consumed = _dechunk(rest)
            if body is None:
                return False
        else:
            match = re.search(rb"content-length:\s*(\d+)", head)
            consumed = int(match.group(1)) if match else 0
            if len(rest) < consumed:
                return False
            body = rest[:consumed]
        self.buffer = rest[consumed:]
        self._answer(head, body)
        return True

    def _answer(self, head: bytes, body: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if head.startswith(b"get ") and b"/models" in head.split(b"\r\n", 1)[0]:
            transport.write(_response(MODELS_BODY))
        elif STREAM_RE.search(body) and HOLD in body:
            transport.write(SSE_HEAD + SSE_CHUNKS[0])
            return
        elif STREAM_RE.search(body):
            transport.write(SSE_HEAD)
            chunks = FRAME_CHUNKS if FRAMES in body else SSE_CHUNKS
            for chunk in (*chunks, SSE_TAIL):  # one write per event, as tokens arrive
                if transport.is_closing():  # the client left mid-stream (end of a wrk run)
                    return
                transport.write(chunk)
        else:
            transport.write(_response(JSON_BODY))
        if b"connection: close" in head:
            transport.close()


def _dechunk(data: bytes) -> tuple[bytes | None, int]:
    """Decode a complete chunked body; (None, 0) while it is still arriving."""
    body, pos = b"", 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return None, 0
        size = int(data[pos:eol].split(b";")[0], 16)
        start, stop = eol + 2, eol + 2 + size
        if len(data) < stop + 2:
            return None, 0
        if size == 0:
            return body, stop + 2
        body += data[start:stop]
        pos = stop + 2


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
