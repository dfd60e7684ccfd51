"""The three listeners need three ports: the Edge routes each request by the port that
accepted it (docs/architecture.md), so a shared port would hide a role (R-REF-1)."""

from __future__ import annotations

from catalog.config.addresses import parse_host_port
from catalog.config.errors import Issues
from catalog.config.rules.context import Context
from catalog.config.schema import AdminDoc, EdgeDoc, OpenAIDoc


def check_listener_ports(ctx: Context, issues: Issues) -> None:
    edge = ctx.parsed.section("edge", EdgeDoc)
    admin = ctx.parsed.section("admin", AdminDoc)
    openai = ctx.openai
    listeners: list[tuple[str, EdgeDoc | AdminDoc | OpenAIDoc | None]] = [
        ("edge", edge),
        ("admin", admin),
    ]
    if openai is not None and openai.enabled:
        listeners.append(("openai", openai))
    seen: dict[int, str] = {}
    for section, doc in listeners:
        if doc is None:
            continue
        port = parse_host_port(doc.listen).port
        if port in seen:
            issues.add((section, "listen"), f"port {port} is already used by {seen[port]}.listen")
        else:
            seen[port] = section
