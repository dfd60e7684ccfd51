"""Upstream faults and cancellations through a real Edge (daphne), a real ``iop-node`` and
loopback upstreams: mid-stream drops and idle stalls, first-byte stalls, a client leaving
while queued, a CLI command killed on cancel. Every test ends with the pool idle (R-POOL-9).

Already proven elsewhere and not repeated here (tests/test_openai_errors_e2e.py): a dropped
tunnel stream through the SDK, a non-stream first-byte 504 on the tunnel path, and a client
leaving a running stream.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes import CLI_TOOL
from tests.support import FakeUpstream, Stack
from tests.support.payloads import chat_body
from tests.support.pids import alive, reaped
from tests.support.stack import provider_row

pytestmark = pytest.mark.slow

CHAT_PATH = "/v1/chat/completions"
FAST_MS = 500  # first-byte and idle timeouts of the fault providers
WAIT_S = 10.0
AT_ONCE_S = 5.0  # far below the queue timeout
PIDFILE = "cli-hang.pid"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("node-faults")
    fast = {"capacity": 2, "first_byte_timeout_ms": FAST_MS, "idle_timeout_ms": FAST_MS}
    providers = [
        {"id": "p-tunnel", "profile": "openai", "base_url": "{up:main}/v1", **fast},
        {"id": "p-ollama", "profile": "ollama", "base_url": "{up:ollama}", **fast},
        {"id": "p-one", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1},
        {
            "id": "p-cli",
            "type": "cli",
            "command": [sys.executable, CLI_TOOL, "hang", str(directory / PIDFILE)],
            "capacity": 1,
        },
    ]
    models = [
        {"id": "tunnel", "providers": {"p-tunnel": "served-tunnel"}},
        {"id": "ollama", "providers": {"p-ollama": "llama3:8b"}},
        {"id": "one-slot", "providers": {"p-one": "served-one"}},
        {"id": "cli", "providers": {"p-cli": "hang"}},
    ]
    with Stack(
        directory,
        upstreams={"main": "openai", "ollama": "ollama"},
        providers=providers,
        models=models,
        pool={"max_queue": 4, "queue_timeout_ms": 30000},
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    with stack.clean_slate():
        yield


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {stack.token}"}
    with httpx.Client(base_url=stack.openai_url, headers=headers, timeout=30) as client:
        yield client


def data_lines(resp: httpx.Response) -> list[str]:
    return [line for line in resp.iter_lines() if line.startswith("data: ")]


def assert_idle_provider(stack: Stack, provider_id: str) -> None:
    stack.wait_idle()
    status = stack.provider(provider_id)
    assert status["online"] and status["in_flight"] == 0 and status["queued"] == 0


# --- failures after the stream started ---------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "provider_id", "upstream", "fault", "code"),
    [
        ("tunnel", "p-tunnel", "main", "stall", "upstream_timeout"),
        ("ollama", "p-ollama", "ollama", "stall", "upstream_timeout"),
        ("ollama", "p-ollama", "ollama", "drop", "upstream_error"),
    ],
)
def test_a_stream_failing_mid_way_ends_with_an_in_band_error_r_pool_9(
    stack: Stack,
    http: httpx.Client,
    model: str,
    provider_id: str,
    upstream: str,
    fault: str,
    code: str,
) -> None:
    """An upstream that stalls past idle_timeout_ms, or drops the connection, after its first
    chunk: the client's stream ends with an error event carrying the code, not a silent end."""
    faults = stack.upstream(upstream).server.faults
    if fault == "stall":
        faults.stall_mid_stream = math.inf
    else:
        faults.drop_mid_stream = True
    with http.stream("POST", CHAT_PATH, json=chat_body(model=model, stream=True)) as resp:
        assert resp.status_code == 200
        lines = data_lines(resp)
    assert len(lines) >= 2 and "data: [DONE]" not in lines
    first = json.loads(lines[0].removeprefix("data: "))
    assert first["choices"][0]["delta"]  # the output before the fault reached the client
    error = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert error["code"] == code and error["type"] == "server_error"
    if fault == "stall":
        assert "idle timeout" in error["message"]
        assert stack.upstream(upstream).wait_disconnect()  # the Node hung up on the stall
    assert_idle_provider(stack, provider_id)


# --- a stall before the first byte -------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "provider_id", "upstream", "stream"),
    [("tunnel", "p-tunnel", "main", True), ("ollama", "p-ollama", "ollama", False)],
)
def test_a_stall_before_the_first_byte_is_a_plain_504_upstream_timeout(
    stack: Stack, http: httpx.Client, model: str, provider_id: str, upstream: str, stream: bool
) -> None:
    """first_byte_timeout_ms: nothing was sent yet, so even a streamed request gets a JSON
    504 (no event stream); the Node abandons the upstream call and the lease (R-POOL-9)."""
    stack.upstream(upstream).server.faults.stall_before_first_byte = math.inf
    started = time.monotonic()
    resp = http.post(CHAT_PATH, json=chat_body(model=model, stream=stream))
    assert time.monotonic() - started < AT_ONCE_S
    assert resp.status_code == 504, resp.text
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert error["code"] == "upstream_timeout" and "first byte" in error["message"]
    assert stack.upstream(upstream).wait_disconnect()
    assert_idle_provider(stack, provider_id)


# --- cancellation ------------------------------------------------------------------------------


async def test_a_client_leaving_while_queued_leaves_the_queue_at_once_r_pool_9(
    stack: Stack,
) -> None:
    """The queued request's client disconnects: the queue is empty again at once, and when
    the slot frees up the upstream never receives that request."""
    main: FakeUpstream = stack.upstream("main")
    main.server.faults.stall_before_first_byte = math.inf
    marker = "left-while-queued"
    headers = {"authorization": f"Bearer {stack.token}"}
    async with httpx.AsyncClient(base_url=stack.openai_url, headers=headers, timeout=30) as cl:
        holder = asyncio.create_task(cl.post(CHAT_PATH, json=chat_body("holder", model="one-slot")))
        await stack.until(lambda s: provider_row(s, "p-one")["in_flight"] == 1, "p-one busy")
        waiter = asyncio.create_task(cl.post(CHAT_PATH, json=chat_body(marker, model="one-slot")))
        await stack.until(
            lambda s: s["queue_depth"] == 1 and provider_row(s, "p-one")["queued"] == 1,
            "one waiter queued",
        )
        waiter.cancel()  # the client goes away while its request waits
        with pytest.raises(asyncio.CancelledError):
            await waiter
        started = time.monotonic()
        await stack.until(lambda s: s["queue_depth"] == 0, "the queue empty")
        assert time.monotonic() - started < AT_ONCE_S
        assert provider_row(await asyncio.to_thread(stack.pool_snapshot), "p-one")["in_flight"] == 1

        holder.cancel()  # frees the slot the waiter would have taken had it stayed
        with pytest.raises(asyncio.CancelledError):
            await holder
    assert main.wait_disconnect()
    await asyncio.to_thread(assert_idle_provider, stack, "p-one")
    bodies = [r.body.decode() for r in main.server.requests]
    assert len(bodies) == 1 and "holder" in bodies[0] and marker not in bodies[0]


def test_a_cli_command_is_killed_when_its_client_leaves_mid_stream(
    stack: Stack, http: httpx.Client
) -> None:
    """The cli adapter's command (and the child it started) are killed and reaped when the
    client disconnects mid-stream; the slot is free again (R-POOL-9)."""
    pidfile = Path(stack.dir / PIDFILE)
    pidfile.unlink(missing_ok=True)
    with http.stream("POST", CHAT_PATH, json=chat_body(model="cli", stream=True)) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()  # held open: a dropped iterator would close the response
        first = next(line for line in lines if line.startswith("data: "))
        assert "started" in first  # the command's first output reached the client
        pid, child = map(int, pidfile.read_text().split())
        assert alive(pid) and alive(child)
        assert stack.provider("p-cli")["in_flight"] == 1
    # Leaving the block closes the half-read response: the client is gone.
    deadline = time.monotonic() + WAIT_S
    while not reaped(pid) or alive(child):
        assert time.monotonic() < deadline, f"command {pid} or child {child} still running"
        time.sleep(0.05)
    assert_idle_provider(stack, "p-cli")
