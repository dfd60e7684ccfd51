"""A queue that talks to its clients, on a real Edge, Node and fake upstreams (R-QUEUE-1,
R-QUEUE-2, R-QUEUE-3): a saturated capacity-1 provider whose jobs take 2 s; the official
OpenAI SDK with ``timeout=1`` (sent as ``X-Stainless-Read-Timeout``) is refused at once with
429 ``queue_wait_exceeded``, one with ``timeout=30`` waits and is served, a group with a
fallback serves the impatient one there; a queued request whose stated deadline passes
leaves the queue at that moment; every answer says how long it waited."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.support import Stack
from tests.support.stack import provider_row
from tests.support.translation import metric
from tests.support.upstream_loop import Hold

pytestmark = pytest.mark.slow

JOB_S = 2.0
PROVIDERS = [
    {"id": "p-busy", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1},
    {"id": "p-spare", "profile": "openai", "base_url": "{up:spare}/v1", "capacity": 1},
    {"id": "p-quick", "profile": "openai", "base_url": "{up:quick}/v1", "capacity": 1},
]
MODELS = [
    {"id": "busy", "providers": {"p-busy": "served"}},
    {"id": "busy-fb", "providers": {"p-busy": "served"}, "fallbacks": ["spare"]},
    {"id": "spare", "providers": {"p-spare": "served"}},
    {"id": "quick", "providers": {"p-quick": "served"}},
    {"id": "busy-ant", "providers": {"p-busy": "served"}, "translate": True},
]
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    upstreams = {"main": "openai", "spare": "openai", "quick": "openai"}
    with Stack(
        tmp_path_factory.mktemp("queue"), upstreams=upstreams, providers=PROVIDERS, models=MODELS
    ) as running:
        yield running


OPENED: list[openai.OpenAI] = []  # closed after each test: no socket outlives it


@pytest.fixture(autouse=True)
def fresh(stack: Stack) -> Iterator[None]:
    stack.reset_upstreams()  # a Hold waits for this test's own stream, not an earlier one's
    yield
    stack.wait_idle()  # R-POOL-9
    while OPENED:
        OPENED.pop().close()


def sdk(stack: Stack, timeout: float) -> openai.OpenAI:
    """The official SDK as an application configures it; no retry, so one answer is seen.
    Closed when the test ends (``fresh``)."""
    client = openai.OpenAI(
        base_url=stack.v1_url, api_key=stack.token, timeout=timeout, max_retries=0
    )
    OPENED.append(client)
    return client


def hold_one(stack: Stack, upstream: str, model: str) -> tuple[Hold, threading.Thread]:
    """A streamed request on ``model`` that holds its provider's one slot until released."""
    hold = Hold(stack.upstream(upstream))
    holder = threading.Thread(
        target=lambda: list(
            sdk(stack, 30).chat.completions.create(model=model, messages=HELLO, stream=True)
        )
    )
    holder.start()
    hold.wait_streaming()
    return hold, holder


def test_an_sdk_timeout_shorter_than_the_estimate_is_refused_at_once_and_a_longer_one_waits(
    stack: Stack,
) -> None:
    faults = stack.upstream("main").server.faults
    faults.stall_before_first_byte = JOB_S  # one measured job: the provider's service time
    sdk(stack, 30).chat.completions.create(model="busy", messages=HELLO)
    faults.stall_before_first_byte = None
    hold, holder = hold_one(stack, "main", "busy")
    upstream_before = len(stack.upstream("main").server.requests)
    try:
        with pytest.raises(openai.RateLimitError) as refused:
            sdk(stack, 1).chat.completions.create(model="busy", messages=HELLO)
        error = refused.value
        assert error.code == "queue_wait_exceeded", error.body
        assert int(error.response.headers["x-iop-queue-eta-ms"]) >= 1000
        assert int(error.response.headers["retry-after"]) >= 1
        assert error.response.headers["x-iop-queue-wait-ms"] == "0"  # it never queued
        assert len(stack.upstream("main").server.requests) == upstream_before

        # R-FALL-1: the same impatient client on a group with a fallback is served there
        served = sdk(stack, 1).chat.completions.with_raw_response.create(
            model="busy-fb", messages=HELLO
        )
        assert served.headers["x-iop-model-group"] == "spare"

        # a patient client waits in the queue and is served when the slot frees
        patient: list[httpx.Headers] = []
        waiter = threading.Thread(
            target=lambda: patient.append(
                sdk(stack, 30)
                .chat.completions.with_raw_response.create(model="busy", messages=HELLO)
                .headers
            )
        )
        waiter.start()
        stack.wait_until(lambda snap: snap["queue_depth"] == 1, what="the patient one queued")
    finally:
        hold.release()
        holder.join(30)
    waiter.join(30)
    assert int(patient[0]["x-iop-queue-wait-ms"]) > 0  # R-QUEUE-1: it waited, and says so
    stack.wait_idle()
    # R-QUEUE-3: its wait against the estimate it queued on, in /metrics
    assert metric(stack, "iop_queue_estimate_error_seconds_count") >= 1


def test_a_queued_request_leaves_the_queue_when_its_deadline_passes(stack: Stack) -> None:
    """R-QUEUE-2: the estimate (a quick provider's) admits it to the queue; its own
    ``x-iop-max-wait-ms`` passes while the slot is still held: 429 then, and the queue is
    empty at that moment although the holder still runs."""
    sdk(stack, 30).chat.completions.create(model="quick", messages=HELLO)  # measured: fast
    hold, holder = hold_one(stack, "quick", "quick")
    try:
        with httpx.Client(base_url=stack.openai_url, timeout=30) as http:
            answer = http.post(
                "/v1/chat/completions",
                json={"model": "quick", "messages": HELLO},
                headers={"authorization": f"Bearer {stack.token}", "x-iop-max-wait-ms": "2000"},
            )
        assert answer.status_code == 429, answer.text
        assert answer.json()["error"]["code"] == "queue_wait_exceeded"
        assert int(answer.headers["x-iop-queue-wait-ms"]) > 0  # it queued: not refused at once
        snap = stack.pool_snapshot()
        assert snap["queue_depth"] == 0
        assert provider_row(snap, "p-quick")["in_flight"] == 1  # the holder still runs
    finally:
        hold.release()
        holder.join(30)
    stack.wait_idle()


def test_a_malformed_deadline_is_ignored_and_every_answer_says_its_wait(stack: Stack) -> None:
    with httpx.Client(base_url=stack.openai_url, timeout=30) as http:
        for value in ("soon", "-1", "1e9", "99999999999999"):
            answer = http.post(
                "/v1/chat/completions",
                json={"model": "spare", "messages": HELLO},
                headers={"authorization": f"Bearer {stack.token}", "x-iop-max-wait-ms": value},
            )
            assert answer.status_code == 200, (value, answer.text)
            assert answer.headers["x-iop-queue-wait-ms"].isdigit()
        refused = http.post("/v1/chat/completions", json={"model": "nope", "messages": HELLO},
                            headers={"authorization": f"Bearer {stack.token}"})  # fmt: skip
        assert refused.status_code == 404
        assert refused.headers["x-iop-queue-wait-ms"] == "0"


def test_a_waiting_stream_hears_where_it_stands_and_both_sdks_read_it_unchanged(
    stack: Stack,
) -> None:
    """R-QUEUE-4: with ``x-iop-queue-events: 1`` a queued streaming request gets SSE comment
    lines while it waits (``: queued position=N eta_ms=M``), then its stream as usual; the
    official OpenAI and Anthropic SDKs skip the comments and read the answer."""
    events = {"x-iop-queue-events": "1"}
    raw = bytearray()
    texts: dict[str, str] = {}

    def read_raw() -> None:
        body = {"model": "busy", "messages": HELLO, "stream": True}
        headers = {"authorization": f"Bearer {stack.token}", **events}
        with (
            httpx.Client(base_url=stack.openai_url, timeout=30) as http,
            http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer,
        ):
            for chunk in answer.iter_raw():
                raw.extend(chunk)

    def read_openai() -> None:
        chunks = sdk(stack, 30).chat.completions.create(
            model="busy", messages=HELLO, stream=True, extra_headers=events
        )
        texts["openai"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def read_anthropic() -> None:
        client = anthropic.Anthropic(base_url=stack.openai_url, api_key=stack.token, max_retries=0)
        with (
            client,
            client.messages.stream(
                model="busy-ant", max_tokens=32, messages=HELLO, extra_headers=events
            ) as stream,
        ):
            texts["anthropic"] = stream.get_final_text()

    hold, holder = hold_one(stack, "main", "busy")
    readers = [threading.Thread(target=f) for f in (read_raw, read_openai, read_anthropic)]
    try:
        for depth, reader in enumerate(readers, start=1):
            reader.start()
            stack.wait_until(lambda snap, d=depth: snap["queue_depth"] == d, what="queued")
        stack.wait_until(lambda _: b": queued position=1" in raw, what="the first queue event")
    finally:
        hold.release()
        holder.join(30)
    for reader in readers:
        reader.join(30)
    text = raw.decode()
    assert text.startswith(": queued position=1"), text[:200]
    assert ": admitted wait_ms=" in text and text.rstrip().endswith("data: [DONE]")
    reply = stack.upstream("main").server.reply_text
    assert texts == {"openai": reply, "anthropic": reply}
    stack.wait_idle()
