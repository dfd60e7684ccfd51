"""R-OBS-1, R-OBS-2 on the Node: a run's context reaches its upstream request as
``x-request-id`` and ``traceparent`` (passed on unchanged while the Node does not trace),
and a probe outside any run sends neither."""

from __future__ import annotations

import msgspec

from nodes import wire
from nodes.agent.adapters.base import RunSpec
from nodes.agent.adapters.openai_compat import OpenAICompatAdapter
from nodes.agent.tracing import RunTracer
from tests.support.payloads import chat_body, openai_provider

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def run_message(**fields: object) -> wire.TunnelRequest:
    body = msgspec.json.encode(chat_body())
    values: dict = {"run_id": "r7", "provider_id": "p1", "operation": "chat_completions",
                    "stream": False, "body": msgspec.Raw(body), **fields}  # fmt: skip
    return wire.TunnelRequest(**values)


async def run_in(ctx, adapter: OpenAICompatAdapter) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    spec = RunSpec(run_id="r7", operation="chat_completions", stream=False,
                   body=msgspec.json.encode(chat_body()))  # fmt: skip
    await asyncio.create_task(adapter.run(spec, lambda text: None), context=ctx)


async def test_the_run_context_reaches_the_upstream_headers_r_obs_1(
    fake_openai, upstream_client
) -> None:
    """R-OBS-1, R-OBS-2: the request id and the Edge's traceparent go upstream unchanged."""
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    message = run_message(request_id="req-node-1", traceparent=TRACEPARENT)
    ctx, span = RunTracer("node-a").begin(message, bytes(message.body))
    assert span is None  # the Node does not trace: nothing of the SDK
    await run_in(ctx, adapter)
    (sent,) = fake_openai.requests
    assert sent.headers["x-request-id"] == "req-node-1"
    assert sent.headers["traceparent"] == TRACEPARENT


async def test_bad_ids_from_the_wire_are_not_sent_upstream(fake_openai, upstream_client) -> None:
    """Every input bounded: an id or traceparent the Edge should never send is not passed on
    as is (a new id; no traceparent)."""
    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    message = run_message(request_id="bad id\r\nx: y", traceparent="00-" + "f" * 500)
    ctx, _ = RunTracer("node-a").begin(message, bytes(message.body))
    await run_in(ctx, adapter)
    (sent,) = fake_openai.requests
    assert len(sent.headers["x-request-id"]) == 24
    assert "traceparent" not in sent.headers


async def test_outside_a_run_no_request_headers_are_added(fake_openai, upstream_client) -> None:
    """A probe or anything outside a run carries neither header."""
    import contextvars

    adapter = OpenAICompatAdapter(openai_provider(fake_openai.url), upstream_client)
    await run_in(contextvars.copy_context(), adapter)
    (sent,) = fake_openai.requests
    assert "x-request-id" not in sent.headers and "traceparent" not in sent.headers
