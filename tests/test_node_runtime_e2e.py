"""The Edge <-> Node runtime end to end: a real Edge (daphne), real ``iop-node`` processes
and loopback upstreams. Readiness, refusal before accept, reconnects with queued waiters
and a Node dying mid-stream (R-NODE-1, R-NODE-3, R-POOL-6, R-POOL-9).

Two Nodes serve one model group ``shared`` (p-a on node-a, p-b on node-b, one slot each);
``b-only`` is served by p-b alone. Each upstream is its own fake, so faults stay apart.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from nodes import wire
from tests.support import FakeUpstream, Stack
from tests.support.payloads import chat_body
from tests.support.processes import Proc, child_env
from tests.support.stack import provider_row

pytestmark = pytest.mark.slow

CHAT_PATH = "/v1/chat/completions"
QUEUE_TIMEOUT_MS = 20000  # far above every "at once" bound below
AT_ONCE_S = 5.0
WAIT_S = 10.0
A, B = 0, 1  # node indexes in the stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    nodes = [
        {
            "id": "node-a",
            "providers": [
                {"id": "p-a", "profile": "openai", "base_url": "{up:a}/v1", "capacity": 1}
            ],
        },
        {
            "id": "node-b",
            "providers": [
                {"id": "p-b", "profile": "openai", "base_url": "{up:b}/v1", "capacity": 1}
            ],
        },
    ]
    models = [
        {"id": "shared", "providers": {"p-a": "served-a", "p-b": "served-b"}},
        {"id": "b-only", "providers": {"p-b": "served-b"}},
    ]
    with Stack(
        tmp_path_factory.mktemp("node-runtime"),
        upstreams={"a": "openai", "b": "openai"},
        nodes=nodes,
        models=models,
        pool={"max_queue": 4, "queue_timeout_ms": QUEUE_TIMEOUT_MS},
        log_level="DEBUG",
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def idle_after(stack: Stack) -> Iterator[None]:
    with stack.clean_slate():
        yield


# --- helpers -----------------------------------------------------------------------------------


def wait_for(done: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout}s"
        time.sleep(0.05)


def client(stack: Stack) -> httpx.AsyncClient:
    headers = {"authorization": f"Bearer {stack.token}"}
    return httpx.AsyncClient(base_url=stack.openai_url, headers=headers, timeout=30)


def sent(upstream: FakeUpstream, marker: str | None = None) -> int:
    """How many chat requests the upstream received (those carrying ``marker``, if given)."""
    return sum(
        1
        for r in upstream.server.requests
        if r.path == CHAT_PATH and (marker is None or marker in r.body.decode())
    )


def node_token(stack: Stack, index: int) -> str:
    return stack.nodes[index].env["IOP_NODE_TOKEN"]


def edge_ws(stack: Stack) -> str:
    return f"ws://127.0.0.1:{stack.ports['edge']}/ws/node"


def dial(stack: Stack, node_id: str, token: str) -> Any:
    """A raw websocket to /ws/node presenting ``node_id`` and ``token`` as a Node does."""
    headers = {"Authorization": f"Bearer {token}", wire.NODE_ID_HEADER: node_id}
    return connect(edge_ws(stack), additional_headers=headers, proxy=None, ping_interval=None)


def ok_requests(stack: Stack, model_group: str, provider_id: str) -> float:
    """``iop_requests_total`` of successful requests for one group and provider."""
    return sum(
        sample.value
        for sample in stack.metrics()
        if sample.name == "iop_requests_total"
        and sample.labels.get("model_group") == model_group
        and sample.labels.get("provider") == provider_id
        and sample.labels.get("code") == "ok"
    )


class LogTail:
    """What a log file gains from now on (tests share one stack, so earlier lines differ)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new(self) -> str:
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode(errors="replace")


def kill_and_wait_offline(stack: Stack, index: int, provider_id: str) -> None:
    stack.kill_node(index)
    stack.wait_until(
        lambda s: not provider_row(s, provider_id)["online"], WAIT_S, "provider offline"
    )


# --- R-NODE-1 / R-POOL-6: readiness ------------------------------------------------------------


async def test_providers_are_candidates_only_once_the_node_is_ready_r_node_1_r_pool_6(
    stack: Stack,
) -> None:
    """Not connected, then accepted-but-pending: offline, and a request fails at once with
    503; after the real Node's ready the same request succeeds."""
    await asyncio.to_thread(kill_and_wait_offline, stack, B, "p-b")
    body = chat_body(model="b-only")
    async with client(stack) as http:
        started = time.monotonic()
        gone = await http.post(CHAT_PATH, json=body)
        assert time.monotonic() - started < AT_ONCE_S  # not the queue timeout
        assert gone.status_code == 503 and gone.json()["error"]["code"] == "no_available_provider"

        # The Node's own token and id, registered but never ready: a pending connection.
        ws: ClientConnection
        async with dial(stack, "node-b", node_token(stack, B)) as ws:
            await ws.send(
                wire.encode(wire.Register(node_id="node-b", protocol=wire.PROTOCOL_VERSION)),
                text=True,
            )
            answer = wire.decode_from_edge(await asyncio.wait_for(ws.recv(), WAIT_S))
            assert isinstance(answer, wire.RegisterResponse)
            assert [p.id for p in answer.payload.providers] == ["p-b"]  # accepted
            snapshot = await asyncio.to_thread(stack.pool_snapshot)
            assert provider_row(snapshot, "p-b")["online"] is False
            started = time.monotonic()
            pending = await http.post(CHAT_PATH, json=body)
            assert time.monotonic() - started < AT_ONCE_S
            assert pending.status_code == 503
            assert pending.json()["error"]["code"] == "no_available_provider"

        await asyncio.to_thread(stack.restart_node, B)  # returns once p-b is online
        served = await http.post(CHAT_PATH, json=body)
    assert served.status_code == 200, served.text
    assert (
        served.json()["choices"][0]["message"]["content"] == stack.upstream("b").server.reply_text
    )
    assert sent(stack.upstream("b")) == 1  # the refused requests never left the Edge
    assert f"node node-b generation {answer.generation} ready" not in stack.logs()


# --- refusal before accept ---------------------------------------------------------------------


async def test_a_bad_node_token_is_refused_with_403_before_accept(stack: Stack) -> None:
    """R-NODE-1: a raw client with node-a's id and a wrong token gets HTTP 403; had it been
    accepted, it would have superseded node-a's live session (newest connection wins)."""
    wrong = "node-wrong-" + "x" * 24
    edge_log, node_log = LogTail(stack.dir / "edge.log"), LogTail(stack.dir / "node-a.log")
    with pytest.raises(InvalidStatus) as refused:
        async with dial(stack, "node-a", wrong):
            pass
    assert refused.value.response.status_code == 403
    snapshot = await asyncio.to_thread(stack.pool_snapshot)
    assert provider_row(snapshot, "p-a")["online"] is True  # node-a's session was never superseded
    edge_lines, node_lines = edge_log.new(), node_log.new()
    assert "superseded" not in edge_lines and "node node-a generation" not in edge_lines
    assert "replaced this one" not in node_lines
    assert wrong not in stack.logs()


def test_a_node_with_a_wrong_token_keeps_retrying_and_never_comes_online(stack: Stack) -> None:
    """R-NODE-1: a real iop-node presenting node-b's id with a wrong token is refused on every
    attempt, node-b's provider stays offline, and no log carries a raw token."""
    kill_and_wait_offline(stack, B, "p-b")
    wrong = "node-wrong-" + "y" * 24
    config = stack.dir / "impostor.yaml"
    config.write_text(
        yaml.safe_dump(
            {"node_id": "node-b", "edge_url": edge_ws(stack), "token": {"env": "IOP_NODE_TOKEN"}}
        )
    )
    argv = [sys.executable, "-m", "nodes.agent.main", "--config", str(config)]
    impostor = Proc(
        "impostor",
        [*argv, "--log-level", "DEBUG", "--shutdown-grace", "1"],
        child_env({"IOP_NODE_TOKEN": wrong}),
        stack.dir / "impostor.log",
    )
    refusals = "the Edge refused node node-b (HTTP 403)"
    edge_log = LogTail(stack.dir / "edge.log")
    impostor.start()
    try:

        def refused_twice() -> bool:
            assert not provider_row(stack.pool_snapshot(), "p-b")["online"]
            return impostor.log.read_text().count(refusals) >= 2

        wait_for(refused_twice, "two refused attempts")
        assert impostor.alive()  # refusal is not fatal: it keeps retrying
    finally:
        impostor.stop()
    impostor_lines = impostor.log.read_text()
    assert "ready: generation" not in impostor_lines
    edge_lines = edge_log.new()
    assert "node node-b generation" not in edge_lines  # no session ever became ready
    assert "node node-b refused: its token does not match" in edge_lines  # the Edge says why
    everything = stack.logs() + impostor_lines
    assert wrong not in everything
    assert node_token(stack, A) not in everything and node_token(stack, B) not in everything


# --- R-NODE-3: a queued waiter across a reconnect ----------------------------------------------


async def test_a_queued_waiter_is_dispatched_once_when_a_node_reconnects_r_node_3(
    stack: Stack,
) -> None:
    """node-b is down and p-a's one slot is held: a request for ``shared`` queues (p-a is a
    live candidate, only full). node-b comes back: the waiter runs there, exactly once."""
    up_a, up_b = stack.upstream("a"), stack.upstream("b")
    await asyncio.to_thread(kill_and_wait_offline, stack, B, "p-b")
    up_a.server.faults.stall_before_first_byte = math.inf
    ok_before = await asyncio.to_thread(ok_requests, stack, "shared", "p-b")
    marker = "queued-across-a-reconnect"
    async with client(stack) as http:
        holder = asyncio.create_task(http.post(CHAT_PATH, json=chat_body("holder", model="shared")))
        await stack.until(lambda s: provider_row(s, "p-a")["in_flight"] == 1, "p-a busy")
        waiter = asyncio.create_task(http.post(CHAT_PATH, json=chat_body(marker, model="shared")))
        await stack.until(lambda s: s["queue_depth"] == 1, "one waiter queued")
        assert not waiter.done()

        await asyncio.to_thread(stack.restart_node, B)
        reply = await asyncio.wait_for(waiter, WAIT_S)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"] == up_b.server.reply_text

        holder.cancel()  # the holder's client leaves: p-a's slot is freed
        with pytest.raises(asyncio.CancelledError):
            await holder
    assert up_a.wait_disconnect()
    await asyncio.to_thread(stack.wait_idle)
    assert sent(up_b, marker) == 1  # one terminal result, one upstream call
    assert sent(up_a, marker) == 0 and sent(up_a) == 1  # p-a only ever saw the holder
    assert await asyncio.to_thread(ok_requests, stack, "shared", "p-b") - ok_before == 1


# --- a Node dying mid-stream -------------------------------------------------------------------


def test_a_node_killed_mid_stream_ends_the_stream_with_an_error_event_r_pool_9(
    stack: Stack,
) -> None:
    """SIGKILL of the Node while it streams: the client gets an in-band error event (never a
    silent truncation), the lease is released, and the restarted Node serves again."""
    up_b = stack.upstream("b")
    up_b.server.faults.stall_mid_stream = math.inf
    headers = {"authorization": f"Bearer {stack.token}"}
    with (
        httpx.Client(base_url=stack.openai_url, headers=headers, timeout=30) as http,
        http.stream("POST", CHAT_PATH, json=chat_body(model="b-only", stream=True)) as resp,
    ):
        assert resp.status_code == 200
        lines = (line for line in resp.iter_lines() if line)
        first = json.loads(next(lines).removeprefix("data: "))
        assert first["choices"][0]["delta"]["role"] == "assistant"
        stack.wait_until(
            lambda s: provider_row(s, "p-b")["in_flight"] == 1, WAIT_S, "p-b streaming"
        )
        stack.kill_node(B)
        rest = list(lines)
    assert rest and rest[-1] != "data: [DONE]"
    error = json.loads(rest[-1].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_error" and error["type"] == "server_error"
    assert up_b.wait_disconnect()  # the dead Node's upstream call went with it

    up_b.reset()
    stack.restart_node(B)
    assert provider_row(stack.pool_snapshot(), "p-b")["in_flight"] == 0  # online, and released
    again = httpx.post(
        stack.v1_url + "/chat/completions",
        json=chat_body(model="b-only"),
        headers=headers,
        timeout=30,
    )
    assert again.status_code == 200, again.text
    assert sent(up_b) == 1
    assert "Traceback" not in (stack.dir / "edge.log").read_text()
