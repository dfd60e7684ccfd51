"""Run the Node agent in-process against a FakeEdge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from nodes.agent.client import Backoff, NodeClient
from nodes.agent.config import parse_config
from tests.fakes.edge import FakeEdge


def node_config(edge: FakeEdge, tmp_path: Path, *, token: str | None = None, **extra: Any) -> Any:
    token_file = tmp_path / "node-token"
    token_file.write_text((token or edge.token) + "\n")
    doc = {"node_id": edge.node_id, "edge_url": edge.url, "token": {"file": str(token_file)}}
    return parse_config(doc | extra, base_dir=tmp_path)


@asynccontextmanager
async def running_node(
    edge: FakeEdge,
    tmp_path: Path,
    *,
    token: str | None = None,
    config: dict[str, Any] | None = None,
    **kw: Any,
) -> AsyncIterator[NodeClient]:
    """A NodeClient running as a task; stopped (gracefully) and awaited on exit."""
    kw.setdefault("backoff", Backoff(initial=0.02, cap=0.2))
    kw.setdefault("close_timeout_s", 1.0)
    client = NodeClient(node_config(edge, tmp_path, token=token, **(config or {})), **kw)
    task = asyncio.create_task(client.run(), name="node-under-test")
    try:
        yield client
    finally:
        client.stop()
        async with asyncio.timeout(15):
            await task
