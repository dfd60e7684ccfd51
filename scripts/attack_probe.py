"""Hostile clients against a real Edge + Node on loopback: what the Edge answers, how fast,
and the Edge's RSS and temp-file bytes around each attack (docs/http-api.md, R-IN-1..6).

    .venv/bin/python scripts/attack_probe.py [--only NAME ...]

Run from a checkout's root (its ``tests.support`` starts the stack). Every attack is bounded
in bytes, connections and seconds; all traffic stays on 127.0.0.1. Prints one JSON line per
attack.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))

from tests.support import Stack

MIB = 1024 * 1024
CHAT = "/v1/chat/completions"


class Sampler:
    """Peak RSS and peak bytes of open regular files (Twisted's spooled bodies) of a pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = self.peak_files = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def open_file_bytes(self) -> int:
        total = 0
        fd_dir = Path(f"/proc/{self.pid}/fd")
        for fd in fd_dir.iterdir():
            try:
                target = os.readlink(fd)
                spooled = target.startswith("/") and not target.startswith(("/dev", "/proc"))
                if spooled and "sqlite" not in target and not target.endswith(".log"):
                    total += os.stat(fd).st_size
            except OSError:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak_rss = max(self.peak_rss, self.rss())
                self.peak_files = max(self.peak_files, self.open_file_bytes())
            except OSError:
                return

    def __enter__(self) -> Sampler:
        self.before_rss = self.peak_rss = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)
        self.after_rss = self.rss()

    def figures(self) -> dict[str, float]:
        return {
            "rss_before_mib": round(self.before_rss / MIB, 1),
            "rss_peak_mib": round(self.peak_rss / MIB, 1),
            "rss_after_mib": round(self.after_rss / MIB, 1),
            "temp_file_peak_mib": round(self.peak_files / MIB, 1),
        }


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def status_of(data: bytes) -> int | None:
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def post(stack: Stack, body: bytes, timeout: float = 60.0) -> tuple[int, Any, float]:
    import httpx

    started = time.monotonic()
    resp = httpx.post(
        stack.v1_url + "/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {stack.token}", "content-type": "application/json"},
        timeout=timeout,
    )
    try:
        doc = resp.json()
    except ValueError:
        doc = resp.text[:200]
    return resp.status_code, doc, time.monotonic() - started


def code_of(doc: Any) -> Any:
    return doc.get("error", {}).get("code") if isinstance(doc, dict) else doc


# --- attacks --------------------------------------------------------------------------------


def big_declared(stack: Stack) -> dict[str, Any]:
    """1 GiB declared, no credentials; the body is pushed until an answer (<= 256 MiB, 20 s)."""
    sent, status, first = 0, None, None
    started = time.monotonic()
    block = b"x" * MIB
    with connect(stack.ports["openai"]) as sock:
        sock.sendall(
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 30}\r\n\r\n".encode()
        )
        sock.setblocking(False)
        while sent < 256 * MIB and time.monotonic() - started < 20:
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                first = time.monotonic() - started
                status = status_of(data)
                break
            if writable:
                try:
                    sent += sock.send(block)
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    continue
    return {
        "status": status,
        "answer_s": round(first, 3) if first else None,
        "sent_mib": round(sent / MIB, 1),
    }


def image_6mib(stack: Stack) -> dict[str, Any]:
    """A chat request carrying one 6 MiB base64 image."""
    image = base64.b64encode(os.urandom(4_500_000)).decode()
    body = json.dumps(
        {
            "model": "gpt-test",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": "data:image/png;base64," + image},
                        },
                    ],
                }
            ],
        }
    ).encode()
    status, doc, took = post(stack, body)
    return {
        "status": status,
        "code": code_of(doc),
        "answer_s": round(took, 3),
        "body_mib": round(len(body) / MIB, 1),
    }


def deep_nesting(stack: Stack) -> dict[str, Any]:
    body = b'{"model":"gpt-test","messages":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    status, doc, took = post(stack, body)
    return {"status": status, "code": code_of(doc), "answer_s": round(took, 3)}


def _open_after(socks: list[socket.socket], within: float) -> tuple[int, float | None]:
    """How many stay open for ``within`` seconds, and when the last one closed."""
    started = time.monotonic()
    open_socks = set(socks)
    last = None
    while open_socks and time.monotonic() - started < within:
        readable, _, _ = select.select(list(open_socks), [], [], 0.5)
        for sock in readable:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if not data:
                open_socks.discard(sock)
                last = time.monotonic() - started
    return len(open_socks), (round(last, 1) if not open_socks and last is not None else None)


def half_headers(stack: Stack, count: int = 150, within: float = 25.0) -> dict[str, Any]:
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    socks = [connect(stack.ports["openai"]) for _ in range(count)]
    for sock in socks:
        sock.sendall(request[: len(request) // 2])
    still_open, all_closed_s = _open_after(socks, within)
    for sock in socks:
        sock.close()
    return {
        "connections": count,
        "open_after_s": within,
        "still_open": still_open,
        "all_closed_at_s": all_closed_s,
    }


def one_byte(stack: Stack, count: int = 20, within: float = 25.0) -> dict[str, Any]:
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 4000
    socks = [connect(stack.ports["openai"]) for _ in range(count)]
    closed: set[socket.socket] = set()
    started = time.monotonic()
    step = 0
    while len(closed) < count and time.monotonic() - started < within:
        for sock in socks:
            if sock in closed:
                continue
            try:
                sock.sendall(request[step % len(request) :][:1])
            except OSError:
                closed.add(sock)
        step += 1
        readable, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.5)
        for sock in readable:
            try:
                if not sock.recv(4096):
                    closed.add(sock)
            except OSError:
                closed.add(sock)
    for sock in socks:
        sock.close()
    return {"connections": count, "open_after_s": within, "still_open": count - len(closed)}


def slow_reader(stack: Stack, stream_mib: int = 32, stall_s: float = 10.0) -> dict[str, Any]:
    """A stream of ``stream_mib`` MiB; the client reads nothing for ``stall_s``, then all."""
    up = stack.upstream().server
    word = "y" * 65535 + " "
    stack.upstream().call(_set(up, "reply_text", word * (stream_mib * 16)))
    body = json.dumps(
        {"model": "gpt-test", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    with connect(stack.ports["openai"], timeout=30) as sock:
        sock.sendall(
            (
                f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.token}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
            ).encode()
        )
        deadline = time.monotonic() + stall_s
        while time.monotonic() < deadline:
            time.sleep(0.2)  # the attack itself: not reading
        upstream_sent = sum(len(r.response) for r in up.requests)
        received, ending, tail = 0, "unfinished after 60 s", b""
        read_until = time.monotonic() + 60
        while time.monotonic() < read_until:
            try:
                data = sock.recv(MIB)
            except OSError as exc:
                ending = type(exc).__name__
                break
            received += len(data)
            if not data:
                ending = "closed early"
                break
            tail = (tail + data)[-16:]
            if tail.endswith(b"\r\n0\r\n\r\n"):
                ending = "complete"
                break
    stack.upstream().call(_set(up, "reply_text", "Hello from the fake upstream."))
    return {
        "stream_mib": stream_mib,
        "upstream_sent_during_stall_mib": round(upstream_sent / MIB, 1),
        "client_received_mib": round(received / MIB, 1),
        "ending": ending,
    }


def huge_usage(stack: Stack) -> dict[str, Any]:
    """The upstream reports prompt_tokens = 2**63; does the usage ledger keep writing?"""
    up = stack.upstream().server
    stack.upstream().call(_set(up, "prompt_tokens", 2**63))
    body = json.dumps(
        {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    status, doc, _took = post(stack, body)
    stack.upstream().call(_set(up, "prompt_tokens", 11))
    deadline = time.monotonic() + 12  # two flush intervals
    failed = False
    while time.monotonic() < deadline and not failed:
        failed = "usage ledger write failed" in stack.logs()
        time.sleep(0.5)
    return {"status": status, "code": code_of(doc), "ledger_write_failed": failed}


async def _set(obj: Any, name: str, value: Any) -> None:
    setattr(obj, name, value)


ATTACKS: dict[str, Callable[[Stack], dict[str, Any]]] = {
    "big_declared": big_declared,
    "image_6mib": image_6mib,
    "deep_nesting": deep_nesting,
    "half_headers": half_headers,
    "one_byte": one_byte,
    "slow_reader": slow_reader,
    "huge_usage": huge_usage,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", choices=sorted(ATTACKS))
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="iop-attack-"))
    with Stack(directory, log_level="WARNING") as stack:
        assert stack.edge is not None and stack.edge.popen is not None
        pid = stack.edge.popen.pid
        for name in args.only or ATTACKS:
            with Sampler(pid) as sampler:
                try:
                    result = ATTACKS[name](stack)
                except Exception as exc:  # a probe reports, it does not stop at one failure
                    result = {"probe_error": f"{type(exc).__name__}: {exc}"[:300]}
            print(json.dumps({"attack": name, **result, **sampler.figures()}), flush=True)


if __name__ == "__main__":
    main()
