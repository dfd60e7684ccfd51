"""What a Node says it will not run (R-TLS-3), read as a peer's text (R-TLS-9); no Django.

A Node reports, in ``ready`` and every ``config_refresh_ack``, the providers it refuses and
why. The map is the Node's own text: only ids of providers the Edge's configuration gives
that Node count (so there are at most that many), each reason is bounded, and each is logged
with ``repr`` so nothing in it can start a log line of its own.
"""

from __future__ import annotations

import logging

log = logging.getLogger("iop.nodes")

MAX_REASON_CHARS = 300  # a Node's reason is shown on the status page: bounded


def refusals(node_id: str, unavailable: dict[str, str], providers: set[str]) -> dict[str, str]:
    """The providers a Node will not run (R-TLS-3), each logged once here. The map is the
    Node's text (R-TLS-9): only ids of that Node's own ``providers`` count (so at most that
    many), each reason is bounded and logged with ``repr``, the rest is counted, never shown."""
    mine = [(pid, reason) for pid, reason in unavailable.items() if pid in providers]
    refused = {pid: reason[:MAX_REASON_CHARS] for pid, reason in mine}
    for provider_id, reason in sorted(refused.items()):
        log.warning("node %s will not run provider %s: %r", node_id, provider_id, reason)
    if len(unavailable) > len(refused):
        log.warning(
            "node %s reported %d unavailable provider(s) it does not have: ignored",
            node_id, len(unavailable) - len(refused),
        )  # fmt: skip
    return refused
