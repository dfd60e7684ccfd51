"""A running Edge in the test process, as the admin and the REST API find it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgekit.running import attach_runtime
from iop_site.runtime import EdgeRuntime
from refresh.startup import startup_snapshot

EDGE_YAML = Path(__file__).resolve().parent.parent.parent / "configs" / "edge.yaml"


@pytest.fixture(name="edge")
def attached_edge(db: None) -> Iterator[EdgeRuntime]:
    """Fixture ``edge``: an EdgeRuntime started from configs/edge.yaml the way runedge starts,
    attached as this process's running Edge for the test and detached after it (import it
    into a test module)."""
    runtime = EdgeRuntime(startup_snapshot(str(EDGE_YAML)))
    attach_runtime(runtime)
    yield runtime
    attach_runtime(None)


def capacity_edit(
    edge: EdgeRuntime, capacity: int, provider_id: str = "vllm-local"
) -> dict[str, Any]:
    """The running document with one provider's capacity changed (a live edit, R-REF-2)."""
    document = edge.snapshot.document
    for node in document["nodes"]:
        for provider in node["providers"]:
            if provider["id"] == provider_id:
                provider["capacity"] = capacity
    return document
