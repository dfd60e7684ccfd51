"""Fallback chains in process (R-FALL-1, R-FALL-2): a request walks a 10-group chain past nine
groups whose providers are offline, only the two fallback codes move it, a stream that has
started never moves, and the meter gets both groups. The real OpenAIApp, pool and hub; a
fake Node on the hub."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nodes import wire
from tests.support.inprocess import FakeNode, api, chat, document, started, stop
from tests.support.processes import sha256_hex


def chain_document(length: int = 10) -> dict[str, Any]:
    """g0 -> g1 -> ... -> g{length-1}; every group but the last on a Node never connected."""
    doc = document()
    offline = [
        {"id": f"p-off{i}", "profile": "openai", "base_url": "http://127.0.0.1:9/v1"}
        for i in range(length - 1)
    ]
    doc["nodes"].append(
        {"id": "n-off", "token_hash_sha256": sha256_hex("off"), "providers": offline}
    )
    doc["models"] += [
        {"id": f"g{i}", "providers": {f"p-off{i}": "served"}, "fallbacks": [f"g{i + 1}"]}
        for i in range(length - 1)
    ]
    doc["models"].append({"id": f"g{length - 1}", "providers": {"p-open": "served-last"}})
    return doc


@pytest.mark.parametrize("stream", [False, True])
async def test_a_ten_group_chain_is_walked_to_the_group_that_can_serve_r_fall_1(stream) -> None:
    """R-FALL-1, R-FALL-2: nine groups with every provider offline answer
    no_available_provider; the tenth serves with its own mapping; the answer names the
    serving group in x-iop-model-group; the meter records both groups, the limiter once."""
    app, runtime, node = await started(chain_document())
    call = await api(app, "POST", "/v1/chat/completions", chat(stream, model="g0")).done()
    assert call.status == 200, call.body
    assert call.headers[b"x-iop-model-group"] == b"g9"
    (run,) = node.runs
    assert b'"served-last"' in bytes(run.body)
    (record,) = runtime.meter.records
    assert (record.model_group, record.requested_group, record.provider_id) == (
        "g9",
        "g0",
        "p-open",
    )
    await stop(runtime)


async def test_a_fallback_served_requests_span_names_the_served_model_r_fall_1() -> None:
    """R-FALL-1, R-OBS-2: the Edge span of a request a fallback group served carries the
    model group asked for and the serving group's model name (gen_ai.response.model)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from obskit.otel import Tracing

    app, runtime, _ = await started(chain_document(3))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app.tracing = Tracing(provider, provider.get_tracer("test"))
    call = await api(app, "POST", "/v1/chat/completions", chat(model="g0")).done()
    assert call.status == 200, call.body
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["gen_ai.request.model"] == "g0"
    assert span.attributes["gen_ai.response.model"] == "served-last"
    await stop(runtime)
    provider.shutdown()


async def test_an_answer_served_by_its_own_group_names_it() -> None:
    """R-FALL-1: x-iop-model-group on every answer a group served; no requested group."""
    app, runtime, _ = await started(chain_document())
    call = await api(app, "POST", "/v1/chat/completions", chat(model="g9")).done()
    assert call.headers[b"x-iop-model-group"] == b"g9"
    assert runtime.meter.records[0].requested_group == ""
    await stop(runtime)


async def test_other_failures_do_not_move_to_a_fallback_r_fall_1() -> None:
    """R-FALL-1: an upstream error (after failover inside the group) stands; only
    no_available_provider and context_length_exceeded move a request."""
    doc = document()
    doc["models"] = [
        {"id": "gpt", "providers": {"p-open": "served-gpt"}, "fallbacks": ["claude"]},
        {"id": "claude", "providers": {"p-anth": "served-claude"}},
    ]
    app, runtime, node = await started(doc)

    async def fail(node: FakeNode, run: Any) -> None:
        error = wire.RunError(code="upstream_error", message="boom", phase="before_first_byte")
        await node.end(run.run_id, ok=False, error=error)

    node.script = fail
    call = await api(app, "POST", "/v1/chat/completions", chat()).done()
    assert call.status == 502 and call.json()["error"]["code"] == "upstream_error"
    assert len(node.runs) == 1  # never sent to the fallback group
    await stop(runtime)


async def test_when_no_group_can_serve_the_asked_groups_refusal_stands_r_fall_1() -> None:
    """R-FALL-1: every group of the chain offline: the requested group's 503."""
    doc = chain_document(3)
    doc["models"][-1]["providers"] = {"p-off0": "served"}  # the last one is offline too
    app, runtime, node = await started(doc)
    call = await api(app, "POST", "/v1/chat/completions", chat(model="g0")).done()
    assert call.status == 503 and call.json()["error"]["code"] == "no_available_provider"
    assert b"x-iop-model-group" not in call.headers and not node.runs
    await stop(runtime)


async def test_an_unknown_model_is_never_echoed_in_the_group_header() -> None:
    """The header names configured groups only; a caller's unknown model is 404 without it."""
    app, runtime, _ = await started(chain_document())
    call = await api(app, "POST", "/v1/chat/completions", chat(model="nope\r\nx-evil: 1")).done()
    assert call.status == 404 and b"x-iop-model-group" not in call.headers
    await stop(runtime)


def test_route_keys_in_managed_mode_never_fall_back_r_fall_1() -> None:
    """R-FALL-1: a route is bound to one group and holds slots for its providers only; the
    scope of a principal token skips the groups it cannot see."""
    from catalog.config import load_snapshot
    from pool.http.auth import Caller
    from pool.http.fallback import chain_of
    from pool.http.operations import ENDPOINTS, parse_request
    from pool.http.tables import Tables

    tables = Tables(load_snapshot(chain_document(4)), 0.0)
    request = parse_request(
        ENDPOINTS["/v1/chat/completions"], json.dumps(chat(model="g0")).encode()
    )
    everyone = Caller("team-a", "app-a")
    assert chain_of(tables, request, everyone, managed=False) == ["g0", "g1", "g2", "g3"]
    assert chain_of(tables, request, everyone, managed=True) == ["g0"]
    scoped = Caller("team-a", "app-a", models=frozenset({"g0", "g2"}))
    assert chain_of(tables, request, scoped, managed=False) == ["g0", "g2"]
