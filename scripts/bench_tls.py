"""The TLS cell of `make bench`: the same Edge+Node with TLS on ``openai.listen`` and mutual
TLS between the Edge and its Node, measured beside the plain Edge in the same invocation
(docs/performance.md). Certificates are minted in the bench's temporary directory."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_client import Probe
from bench_upstream import EVENTS

from tests.support import Stack
from tests.support.tls import Pki

NAME = "edge-tls"


class TlsTarget:
    """An https Edge: what `bench.py` needs of a target (url, body, probe, events, pids)."""

    def __init__(self, stack: Stack, ca_file: Path, bodies: dict[str, Any]) -> None:
        assert stack.edge and stack.edge.popen and stack.nodes[0].popen
        self.name, self.port, self.token = NAME, stack.ports["openai"], stack.token
        self.pids = {"edge": stack.edge.popen.pid, "node": stack.nodes[0].popen.pid}
        self.url = f"https://127.0.0.1:{self.port}/v1/chat/completions"  # wrk: no verify
        self.events = EVENTS
        self._tls = ssl.create_default_context(cafile=ca_file)
        self._bodies = bodies

    def body(self, mode: str) -> bytes:
        return json.dumps(self._bodies[mode]).encode()

    def probe(self, mode: str) -> Probe:
        return Probe(
            "127.0.0.1", self.port, "/v1/chat/completions", self.body(mode), self.token, self._tls
        )


@contextlib.contextmanager
def cell(directory: Path, upstream_port: int, bodies: dict[str, Any]) -> Iterator[TlsTarget]:
    """A second Edge+Node like the plain one, over TLS (Node link: mutual TLS)."""
    pki = Pki(directory / "pki")
    client = pki.client("node-1")
    server = {"cert_file": str(pki.edge.cert), "key_file": str(pki.edge.key)}
    node_tls = {"ca_file": str(pki.ca_file), "cert_file": str(client.cert),
                "key_file": str(client.key)}  # fmt: skip
    providers = [{"id": "p-bench", "profile": "openai", "capacity": 256,
                  "base_url": f"http://127.0.0.1:{upstream_port}/v1"}]  # fmt: skip
    with Stack(
        directory / "stack",
        upstreams={},
        nodes=[{"id": "node-1", "providers": providers, "config": {"tls": node_tls}}],
        models=[{"id": "bench", "providers": {"p-bench": "bench-served"}}],
        pool={"max_queue": 1024},
        openai={"tls": server},
        edge={"tls": {**server, "client_ca_file": str(pki.ca_file)}},
        log_level="WARNING",
    ) as stack:
        yield TlsTarget(stack, pki.ca_file, bodies)
        stack.wait_idle()


def compare(rows: list[Any]) -> str:
    """TLS against plain, per cell: what TLS costs."""
    by = {(r.target, r.mode, r.c): r for r in rows}
    lines = [
        "",
        "## TLS against plain (ratio = edge-tls / edge)",
        "",
        "| mode | c | req/s plain | req/s TLS | req/s ratio | p50 added ms | TTFB added ms "
        "| Edge CPU ms/req plain | Edge CPU ms/req TLS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (target, mode, c), tls in by.items():
        plain = by.get(("edge", mode, c))
        if target != NAME or plain is None:
            continue
        ttfb = f"{tls.ttfb_ms(50) - plain.ttfb_ms(50):+.2f}" if tls.ttfb_s else "-"
        lines.append(
            f"| {mode} | {c} | {plain.rps:.0f} | {tls.rps:.0f} | "
            f"{tls.rps / plain.rps if plain.rps else 0:.2f}x | "
            f"{tls.wrk.p50_ms - plain.wrk.p50_ms:+.2f} | {ttfb} | "
            f"{plain.cpu_ms.get('edge', 0):.2f} | {tls.cpu_ms.get('edge', 0):.2f} |"
        )
    return "\n".join(lines)
