"""The TLS cells of `make bench`: the same Edge+Node with TLS on ``openai.listen`` and mutual
TLS between the Edge and its Node, measured beside the plain Edge in the same rounds
(docs/performance.md). Certificates are minted in the bench's temporary directory."""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Iterator

from bench_cells import BODIES, BenchContext, Cell, bench_providers, edge_stack, section, suite
from bench_report import Figures

from tests.support.tls import Pki

NAME = "edge-tls"
CONCURRENCY = (1, 16)  # c=64 left out to keep `make bench` within ~5 minutes


@suite("tls")
def tls_suite(ctx: BenchContext) -> Iterator[list[Cell]]:
    """A second Edge+Node like the plain one, over TLS (Node link: mutual TLS)."""
    pki = Pki(ctx.workdir / "pki")
    client = pki.client("node-1")
    server = {"cert_file": str(pki.edge.cert), "key_file": str(pki.edge.key)}
    node_tls = {"ca_file": str(pki.ca_file), "cert_file": str(client.cert),
                "key_file": str(client.key)}  # fmt: skip
    with edge_stack(
        ctx,
        NAME,
        nodes=[{"id": "node-1", "providers": bench_providers(ctx), "config": {"tls": node_tls}}],
        openai={"tls": server},
        edge={"tls": {**server, "client_ca_file": str(pki.ca_file)}},
    ) as plain_target:
        target = dataclasses.replace(  # wrk does not verify; the probe checks the chain
            plain_target, tls=ssl.create_default_context(cafile=pki.ca_file)
        )
        levels = [c for c in ctx.options.concurrency or CONCURRENCY if c in CONCURRENCY]
        yield [Cell(target, mode, c) for mode in BODIES for c in levels]


@section
def compare(f: Figures) -> list[str]:
    """TLS against plain, per cell (medians): what TLS costs."""
    lines = [
        "## TLS against plain (medians; ratio = edge-tls / edge)",
        "",
        "| mode | c | req/s plain | req/s TLS | req/s ratio | p50 added ms | TTFB added ms "
        "| Edge CPU ms/req plain | Edge CPU ms/req TLS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for target, mode, c in f.runs:
        tls, plain = (target, mode, c), ("edge", mode, c)
        if target != NAME or not f.has(plain):
            continue
        rps_tls, rps_plain = f.median(tls, "rps"), f.median(plain, "rps")
        ttfb = f.median(tls, "ttfb50") - f.median(plain, "ttfb50")
        lines.append(
            f"| {mode} | {c} | {rps_plain:.0f} | {rps_tls:.0f} | "
            f"{rps_tls / rps_plain if rps_plain else 0:.2f}x | "
            f"{f.median(tls, 'p50') - f.median(plain, 'p50'):+.2f} | "
            f"{f'{ttfb:+.2f}' if mode == 'stream' else '-'} | "
            f"{f.cpu(plain, 'edge'):.2f} | {f.cpu(tls, 'edge'):.2f} |"
        )
    return lines
