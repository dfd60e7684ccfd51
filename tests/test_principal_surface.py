"""Per-token policy in the OpenAI surface, in process (a real pool and NodeHub, a scripted
Node, the OpenAIApp driven the way daphne drives it): cancelled requests return every
per-token counter to zero (R-PRIN-2, R-PRIN-3, R-POOL-9); streams carry the headers."""

from __future__ import annotations

import asyncio
from typing import Any

from pool.http.app import OpenAIApp
from tests.support import sha256_hex
from tests.support.inprocess import TOKEN, WAIT, FakeNode, Runtime, api, chat, document, until

POLICY = {"max_in_flight": 5, "tpm": 100_000, "rpm": 100, "max_queued": 3}


def policy_document() -> dict[str, Any]:
    doc = document()
    doc["provider_pool"] = {"max_queue": 4, "queue_timeout_ms": 30000}
    doc["openai"]["principal_tokens"] = [
        {
            "token_ref": "app-a",
            "token_hash_sha256": sha256_hex(TOKEN),
            "principal_ref": "team-a",
            **POLICY,
        }
    ]
    return doc


async def hold(node: FakeNode, run: Any) -> None:
    await node.release.wait()
    await node.end(run.run_id)


async def test_a_token_whose_requests_are_all_cancelled_returns_every_counter_to_zero() -> None:
    """R-PRIN-2, R-PRIN-3: in-flight, queued share and pool counters end at zero."""
    runtime = Runtime(policy_document())
    node = await FakeNode(runtime.hub).start()
    node.script = hold
    app = OpenAIApp(runtime)
    try:
        running = api(app, "POST", "/v1/chat/completions", chat(stream=True))
        async with asyncio.timeout(WAIT):
            await node.run_seen.wait()
        queued = [api(app, "POST", "/v1/chat/completions", chat()) for _ in range(3)]
        await until(lambda: runtime.pool.queued_by("app-a") == 3)
        assert app.limiter.in_flight("app-a") == 4
        over = await api(app, "POST", "/v1/chat/completions", chat()).done()
        assert (over.status, over.json()["error"]["code"]) == (429, "queue_full")
        assert app.limiter.in_flight("app-a") == 4  # the refused one gave its slot back
        for call in (*queued, running):
            call.disconnect()
            await call.done()
        assert app.limiter.in_flight("app-a") == 0
        assert runtime.pool.queued_by("app-a") == 0
        assert runtime.pool.idle()
        requests, tokens = app.limiter.used("app-a")
        assert requests == 5
        # Only the run that reached a provider keeps a charge: its input estimate.
        (record,) = [r for r in runtime.meter.records if r.provider_id is not None]
        assert tokens == record.input_tokens + record.output_tokens
        assert [r.code for r in runtime.meter.records].count("client_closed") == 4
    finally:
        node.release.set()
        await runtime.hub.aclose()


async def test_a_streamed_answer_carries_the_rate_limit_headers() -> None:
    """R-PRIN-2: the x-ratelimit-* headers come on the stream's response start too."""
    runtime = Runtime(policy_document())
    await FakeNode(runtime.hub).start()
    app = OpenAIApp(runtime)
    try:
        call = await api(app, "POST", "/v1/chat/completions", chat(stream=True)).done()
        assert call.status == 200
        assert call.headers[b"content-type"] == b"text/event-stream"
        assert call.headers[b"x-ratelimit-limit-requests"] == b"100"
        assert call.headers[b"x-ratelimit-remaining-requests"] == b"99"
        assert call.headers[b"x-ratelimit-limit-tokens"] == b"100000"
        assert int(call.headers[b"x-ratelimit-remaining-tokens"]) < 100_000
        assert call.headers[b"x-ratelimit-reset-requests"].endswith(b"s")
        assert app.limiter.in_flight("app-a") == 0
    finally:
        await runtime.hub.aclose()
