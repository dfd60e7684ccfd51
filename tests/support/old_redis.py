"""A loopback server speaking the Redis wire protocol that reports an old version in ``HELLO``
and ``INFO``, as a Redis 6 does: what an Edge sees when IOP_REDIS_URL points at a Redis too
old for scale-out (R-SCALE-9). Every other command gets an error, as an old server answers a
command it does not know."""

from __future__ import annotations

import socketserver
import threading
from typing import Any


def _read_command(stream: Any) -> list[bytes] | None:
    header = stream.readline()
    if not header.startswith(b"*"):
        return None
    args = []
    for _ in range(int(header[1:])):
        size = int(stream.readline()[1:])
        args.append(stream.read(size + 2)[:-2])
    return args


class OldRedis:
    """``with OldRedis("6.0.16") as server:`` ``server.url`` answers as that version."""

    def __init__(self, version: str) -> None:
        info = f"# Server\r\nredis_version:{version}\r\nredis_mode:standalone\r\n".encode()

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                while (command := _read_command(self.rfile)) is not None:
                    name = command[0].upper() if command else b""
                    if name == b"HELLO":  # RESP3, as Redis 6 answers it
                        fields = [b"server", b"redis", b"version", version.encode()]
                        body = b"".join(b"+%s\r\n" % f for f in fields)
                        self.wfile.write(b"%%3\r\n%s+proto\r\n:3\r\n" % body)
                    elif name == b"INFO":
                        self.wfile.write(b"$%d\r\n%s\r\n" % (len(info), info))
                    elif name == b"PING":
                        self.wfile.write(b"+PONG\r\n")
                    else:
                        self.wfile.write(b"-ERR unknown command\r\n")

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"redis://127.0.0.1:{self._server.server_address[1]}/0"

    def __enter__(self) -> OldRedis:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
