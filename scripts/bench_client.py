"""Load tools of `make bench`: wrk for throughput, a raw asyncio probe for time to first byte.

The probe speaks HTTP/1.1 over one keep-alive socket and decodes chunked bodies itself, so
what it measures is the server, not an HTTP library.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

LUA = Path(__file__).with_name("bench_wrk.lua")


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def run_wrk(
    url: str,
    body: bytes,
    token: str,
    connections: int,
    seconds: float,
    ports: tuple[int, ...] = (),
    headers: tuple[tuple[str, str], ...] = (),
) -> WrkResult:
    """One wrk run (one thread: this machine has two cores to share with the servers). With
    ``ports`` (several Edges on 127.0.0.1), one thread per port, each thread's connections on
    its own port (``bench_wrk.lua`` ``setup``): the client's connections alternate over the
    Edges and the summary covers them all. ``headers`` are added to every request."""
    env = {**os.environ, "BENCH_BODY": body.decode(), "BENCH_TOKEN": token}
    env["BENCH_HEADERS"] = "\n".join(f"{name}: {value}" for name, value in headers)
    env["BENCH_PORTS"] = ",".join(str(port) for port in ports)
    out = subprocess.run(
        [
            "wrk",
            f"-t{max(1, len(ports))}",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "-s",
            str(LUA),
            url,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds + 30,
        check=True,
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("BENCH "))
    data = json.loads(line[len("BENCH ") :])
    return WrkResult(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        errors=sum(data["errors"].values()),
    )


def post_request(
    host: str, port: int, path: str, body: bytes, token: str,
    extra: tuple[tuple[str, str], ...] = (),
) -> bytes:  # fmt: skip
    """One HTTP/1.1 POST of a JSON ``body`` as bytes (``extra``: more header fields)."""
    headers = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
    ]
    if token:
        headers.append(f"Authorization: Bearer {token}")
    headers += [f"{name}: {value}" for name, value in extra]
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


@dataclass(frozen=True)
class StreamSample:
    ttfb_s: float  # request written -> first body bytes holding an SSE "data:" event
    total_s: float
    events: int
    status: int


class Probe:
    """One keep-alive connection that sends POSTs and times each response."""

    def __init__(
        self, host: str, port: int, path: str, body: bytes, token: str,
        tls: ssl.SSLContext | None = None, extra: tuple[tuple[str, str], ...] = (),
    ) -> None:  # fmt: skip
        self.request = post_request(host, port, path, body, token, extra)
        self.host, self.port, self.tls = host, port, tls
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def one(self) -> StreamSample:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.tls
            )
        reader, writer = self.reader, self.writer
        assert reader is not None
        start = time.perf_counter()
        writer.write(self.request)
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        status = int(head.split(b" ", 2)[1])
        first: float | None = None
        events = 0
        if b"transfer-encoding: chunked" in head:
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    break
                events += chunk.count(b"data:")
                if first is None and b"data:" in chunk:
                    first = time.perf_counter()
        else:
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            chunk = await reader.readexactly(length)
            events = chunk.count(b"data:")
            first = time.perf_counter()
        end = time.perf_counter()
        if b"connection: close" in head:
            await self.close()
        return StreamSample(
            ttfb_s=(first or end) - start, total_s=end - start, events=events, status=status
        )

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def probe_for(probe: Probe, seconds: float, limit: int = 5000) -> list[StreamSample]:
    """Sequential requests on one connection for ``seconds`` (at most ``limit``)."""
    samples: list[StreamSample] = []
    deadline = time.perf_counter() + seconds
    try:
        while time.perf_counter() < deadline and len(samples) < limit:
            samples.append(await probe.one())
    finally:
        await probe.close()
    return samples


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MB, from /proc/<pid>/status."""
    fields = dict(
        line.split(":", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if ":" in line
    )
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def load_average() -> float:
    """The machine's 1-minute load average (other work competing for the CPUs)."""
    return os.getloadavg()[0]


def scrape(url: str) -> str:
    """GET a Prometheus text exposition (loopback only)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())
