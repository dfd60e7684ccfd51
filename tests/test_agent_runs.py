"""Runs over the wire: concurrency, exactly one run_end per run, cancel, errors."""

from __future__ import annotations

import asyncio
import math

import msgspec
import pytest

from nodes import wire
from nodes.agent.adapters.base import Emit, RunSpec
from tests.fakes import FakeOllama, FakeOpenAI
from tests.fakes.edge import EdgeConn, FakeEdge
from tests.support.node_agent import running_node
from tests.support.payloads import (
    chat_body,
    cli_provider,
    node_payload,
    ollama_provider,
    openai_provider,
)
from tests.support.pids import reaped


@pytest.fixture
async def good():
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def bad():
    async with FakeOpenAI() as server:
        server.faults.status = 429
        server.faults.error_message = "rate limited"
        yield server


@pytest.fixture
async def ollama():
    async with FakeOllama() as server:
        yield server


@pytest.fixture
async def edge(good, bad, ollama):
    payload = node_payload(
        openai_provider(good.url, pid="good"),
        openai_provider(bad.url, pid="bad"),
        ollama_provider(ollama.url, pid="llama"),
        cli_provider("echo", pid="echo"),
    )
    async with FakeEdge(payload) as fake:
        yield fake


async def barrier(conn: EdgeConn) -> None:
    """Every frame the Node sent before answering this ping has arrived."""
    await conn.send(wire.Ping(ts=99.0))
    await conn.next_of(wire.Pong)


class Boom:
    async def run(self, request: RunSpec, emit: Emit) -> wire.Usage | None:
        raise RuntimeError("secret detail that must stay local")

    async def aclose(self) -> None:
        pass


async def test_stream_run_relays_upstream_text_and_ends_with_usage(edge, good, tmp_path):
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        body = chat_body(stream=True, stream_options={"include_usage": True})
        await conn.tunnel("r1", "good", "chat_completions", body, stream=True)
        log = await conn.wait_end("r1")
        assert log.text == good.requests[0].response.decode()
        assert log.ends == [
            wire.RunEnd(
                run_id="r1",
                ok=True,
                usage=wire.Usage(
                    input_tokens=good.prompt_tokens, output_tokens=good.completion_tokens
                ),
            )
        ]


@pytest.mark.parametrize("protocol", [3, 2])
async def test_cached_input_tokens_reach_only_an_edge_that_chose_protocol_3_r_cost_1(
    good, tmp_path, protocol
):
    """R-COST-1, R-HA-4: the upstream reports 6 of its 11 prompt tokens cached; an Edge that
    chose the wire subprotocol (3) gets them in the run's usage, one of 2 (it would refuse the
    field) gets the usage without them, and the Node registered with the Edge's protocol."""
    good.cached_tokens = 6
    async with (
        FakeEdge(node_payload(openai_provider(good.url, pid="good")), protocol=protocol) as fake,
        running_node(fake, tmp_path),
    ):
        conn = await fake.next_connection()
        assert isinstance(conn.received[0], wire.Register)
        assert conn.received[0].protocol == protocol
        for run_id, stream in (("s", True), ("n", False)):
            body = chat_body(stream=stream, stream_options={"include_usage": True})
            await conn.tunnel(run_id, "good", "chat_completions", body, stream=stream)
            (end,) = (await conn.wait_end(run_id)).ends
            assert end.usage == wire.Usage(
                input_tokens=good.prompt_tokens,
                output_tokens=good.completion_tokens,
                cached_input_tokens=6 if protocol == 3 else 0,
            ), run_id


async def test_runs_are_concurrent(edge, good, tmp_path):
    good.faults.hold_mid_stream = hold = asyncio.Event()
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        ids = [f"c{i}" for i in range(8)]
        for run_id in ids:
            await conn.tunnel(
                run_id, "good", "chat_completions", chat_body(stream=True), stream=True
            )
        await good.wait_concurrent(len(ids))  # every run is upstream at the same time
        hold.set()
        logs = [await conn.wait_end(run_id) for run_id in ids]
        assert good.peak == len(ids)
        assert all(log.ends[0].ok for log in logs)
        assert {log.text for log in logs} == {good.requests[0].response.decode()}


async def test_normalized_runs_on_ollama_and_cli(edge, tmp_path):
    """R-POOL-10: run_request (normalized) reaches the ollama and cli adapters."""
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        await conn.run_request(
            "o1", "llama", chat_body(model="llama3:8b", stream=True), stream=True
        )
        await conn.run_request("e1", "echo", chat_body("ping me back"), stream=False)
        ollama_log, echo_log = await conn.wait_end("o1"), await conn.wait_end("e1")
        assert ollama_log.text.endswith("data: [DONE]\n\n") and ollama_log.ends[0].ok
        assert '"content":"ping me back"' in echo_log.text
        assert echo_log.ends[0].usage is not None and echo_log.ends[0].usage.estimated


async def test_a_non_stream_answer_travels_in_its_run_end_alone(edge, good, tmp_path):
    """Protocol 2: a non-stream run is one frame, its run_end with the answer and usage;
    a stream run still sends its output as run_events."""
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        await conn.tunnel("n1", "good", "chat_completions", chat_body(), stream=False)
        answer = await conn.wait_end("n1")
        await conn.tunnel("s1", "good", "chat_completions", chat_body(stream=True), stream=True)
        stream = await conn.wait_end("s1")
        frames = [m for m in conn.received if getattr(m, "run_id", "") == "n1"]
        assert [type(m) for m in frames] == [wire.RunEnd]
        (end,) = frames
        assert end.ok and end.data == good.requests[0].response.decode() == answer.text
        assert end.usage is not None and end.usage.input_tokens == good.prompt_tokens
        streamed = [m for m in conn.received if getattr(m, "run_id", "") == "s1"]
        assert isinstance(streamed[0], wire.RunEvent) and streamed[-1].data == ""
        assert stream.text.endswith("data: [DONE]\n\n")


async def test_exactly_one_run_end_per_run_whatever_ends_it(edge, good, tmp_path):
    async with running_node(edge, tmp_path) as client:
        conn = await edge.next_connection()
        assert client.registries.current is not None
        client.registries.current.adapters["boom"] = Boom()
        good.faults.hold_mid_stream = hold = asyncio.Event()
        await conn.tunnel("ok", "good", "chat_completions", chat_body())
        await conn.tunnel("upstream-error", "bad", "chat_completions", chat_body())
        await conn.tunnel("unknown", "nowhere", "chat_completions", chat_body())
        await conn.tunnel("bad-op", "good", "messages", {})
        await conn.run_request("crash", "boom", chat_body())
        await conn.tunnel("cancel", "good", "chat_completions", chat_body(stream=True), stream=True)
        async with asyncio.timeout(5):
            await good.streaming.wait()
        await conn.send(wire.Cancel(run_id="cancel"))
        await conn.send(wire.Cancel(run_id="no-such-run"))  # ignored
        await conn.wait_end("cancel")
        hold.set()
        ends = {
            run_id: (await conn.wait_end(run_id)).ends
            for run_id in ("ok", "upstream-error", "unknown", "bad-op", "crash", "cancel")
        }
        await barrier(conn)
        assert client.router is not None and client.router.runs == {}
        assert {run_id: len(e) for run_id, e in ends.items()} == dict.fromkeys(ends, 1)
        codes = {
            run_id: (e[0].ok, e[0].error.code if e[0].error else None) for run_id, e in ends.items()
        }
        assert codes == {
            "ok": (True, None),
            "upstream-error": (False, "upstream_error"),
            "unknown": (False, "unknown_provider"),
            "bad-op": (False, "bad_request"),
            "crash": (False, "upstream_error"),
            "cancel": (False, "cancelled"),
        }
        error = ends["upstream-error"][0].error
        assert error is not None and (error.status, error.retryable) == (429, True)
        crash = ends["crash"][0].error
        assert crash is not None and crash.message == "internal node error (RuntimeError)"
        assert "no-such-run" not in conn.runs or conn.runs["no-such-run"].ends == []


async def test_a_run_cancelled_before_its_task_begins_still_ends_once(edge, good, tmp_path):
    """A cancel handled in the same loop step as its run_request (frames read back to back)
    reaches a task that has not begun: the run still ends with one ``cancelled`` run_end,
    nothing is dialed, and the registry's count of active runs returns to zero."""
    async with running_node(edge, tmp_path) as client:
        conn = await edge.next_connection()
        router, registry = client.router, client.registries.current
        assert router is not None and registry is not None
        request = wire.TunnelRequest(
            run_id="early",
            provider_id="good",
            operation="chat_completions",
            stream=False,
            body=msgspec.Raw(msgspec.json.encode(chat_body())),
        )
        await router.handle(request)
        await router.handle(wire.Cancel(run_id="early"))  # no await between: not begun
        log = await conn.wait_end("early")
        await barrier(conn)
        assert [(e.ok, e.error.code if e.error else None) for e in log.ends] == [
            (False, "cancelled")
        ]
        assert log.text == "" and good.requests == []
        assert registry.active == 0 and router.runs == {}


async def test_cancel_reaches_the_upstream(edge, good, tmp_path):
    good.faults.stall_mid_stream = math.inf
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        log = await conn.tunnel(
            "r1", "good", "chat_completions", chat_body(stream=True), stream=True
        )
        async with asyncio.timeout(5):
            await good.streaming.wait()
        await conn.send(wire.Cancel(run_id="r1"))
        await conn.wait_end("r1")
        async with asyncio.timeout(5):
            await good.disconnected.wait()
        assert log.ends[0].error == wire.RunError(
            code="cancelled",
            message="run cancelled by the edge",
            phase=wire.PHASE_AFTER_FIRST_BYTE,  # it had streamed: never retried (R-HEALTH-1)
        )


async def test_cancel_kills_a_cli_run(good, tmp_path):
    pidfile = tmp_path / "pids"
    payload = node_payload(cli_provider("hang", str(pidfile), pid="hang"))
    async with FakeEdge(payload) as edge, running_node(edge, tmp_path):
        conn = await edge.next_connection()
        log = await conn.run_request("h1", "hang", chat_body(), stream=True)
        async with asyncio.timeout(10):
            await log.started.wait()  # the command has started and printed
        pid = int(pidfile.read_text().split()[0])
        await conn.send(wire.Cancel(run_id="h1"))
        await conn.wait_end("h1")
        assert log.ends[0].error is not None and log.ends[0].error.code == "cancelled"
        assert reaped(pid)  # killed and reaped


async def test_duplicate_run_request_is_ignored(edge, good, tmp_path):
    good.faults.hold_mid_stream = hold = asyncio.Event()
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        await conn.tunnel("dup", "good", "chat_completions", chat_body(stream=True), stream=True)
        async with asyncio.timeout(5):
            await good.streaming.wait()
        await conn.tunnel("dup", "good", "chat_completions", chat_body(stream=True), stream=True)
        await barrier(conn)
        hold.set()
        log = await conn.wait_end("dup")
        await barrier(conn)
        assert len(log.ends) == 1 and len(good.requests) == 1
