"""The Node's side of large bodies and flow control, against a real ``iop-node`` process:
bodies arriving in parts are reassembled within bounds (R-IN-2), and with credit the Node
sends no more than it was allowed and stops reading its upstream (R-IN-5)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from nodes import wire
from nodes.agent.router import MAX_PENDING_BODIES, _Bodies
from tests.fakes import FakeOpenAI
from tests.fakes.edge import EdgeConn, FakeEdge, RunLog
from tests.support.node_agent import running_node
from tests.support.payloads import chat_body, node_payload, openai_provider


@pytest.fixture
async def good():
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def edge(good):
    async with FakeEdge(node_payload(openai_provider(good.url, pid="good"))) as fake:
        yield fake


async def barrier(conn: EdgeConn) -> None:
    """Every frame the Node sent before answering this ping has arrived."""
    await conn.send(wire.Ping(ts=7.0))
    await conn.next_of(wire.Pong)


async def output(conn: EdgeConn, log: RunLog, chars: int) -> None:
    """Round-trip pings until ``chars`` characters of the run's output have arrived."""
    async with asyncio.timeout(10):
        while len(log.text) < chars:
            await barrier(conn)


def tunnel(run_id: str, parts: int, *, credit: int = 0, stream: bool = False) -> wire.TunnelRequest:
    return wire.TunnelRequest(
        run_id=run_id,
        provider_id="good",
        operation="chat_completions",
        stream=stream,
        body=msgspec.Raw(b"null"),
        body_parts=parts,
        credit=credit,
    )


async def test_r_in_2_a_body_in_parts_reaches_the_upstream_whole(edge, good, tmp_path):
    """R-IN-2: three run_body_part messages, then the request that counts them."""
    body = msgspec.json.encode(chat_body("é" * 300_000 + "end")).decode()
    pieces = wire.split(body, len(body) // 3 + 1)
    assert len(pieces) == 3
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        log = conn.run("b1")
        for piece in pieces:
            await conn.send(wire.RunBodyPart(run_id="b1", data=piece))
        await conn.send(tunnel("b1", len(pieces)))
        await conn.wait_end("b1")
        assert log.ends[0].ok
        assert good.requests[0].body == body.encode()


async def test_r_in_2_a_request_missing_parts_is_refused_as_a_bad_request(edge, good, tmp_path):
    """R-IN-2: the request says three parts, two arrived: the run ends, nothing goes up."""
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        log = conn.run("b2")
        for piece in ("{", '"model":1}'):
            await conn.send(wire.RunBodyPart(run_id="b2", data=piece))
        await conn.send(tunnel("b2", 3))
        await conn.wait_end("b2")
        assert log.ends[0].error is not None and log.ends[0].error.code == "bad_request"
        assert good.requests == []


def test_r_in_2_pending_bodies_are_bounded_in_count_and_size() -> None:
    """R-IN-2: past the bounds the body is refused (and its request will be), never kept."""
    bodies = _Bodies()
    for i in range(MAX_PENDING_BODIES + 1):
        bodies.add(wire.RunBodyPart(run_id=f"r{i}", data="x"))
    assert len(bodies.parts) == MAX_PENDING_BODIES
    assert bodies.take(f"r{MAX_PENDING_BODIES}", 1) is None
    huge = "y" * wire.MAX_EVENT_DATA_CHARS
    bodies = _Bodies()
    for _ in range(wire.MAX_BODY_CHARS // len(huge) + 1):
        bodies.add(wire.RunBodyPart(run_id="big", data=huge))
    assert "big" not in bodies.parts
    assert bodies.take("big", 1) is None


async def test_r_in_5_with_credit_the_node_sends_no_more_than_it_was_allowed(edge, good, tmp_path):
    """R-IN-5: a 2 MiB stream with 1000 characters of credit: exactly 1000 arrive, more only
    after a credit message, and the run still ends whole once credit keeps coming."""
    good.reply_text = "z" * 2_000_000
    body = msgspec.json.encode(chat_body(stream=True)).decode()
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        log = conn.run("c1")
        await conn.send(wire.RunBodyPart(run_id="c1", data=body))
        await conn.send(tunnel("c1", 1, credit=1000, stream=True))
        await output(conn, log, 1000)
        await barrier(conn)
        assert len(log.text) == 1000 and not log.ends  # held at its credit
        await conn.send(wire.Credit(run_id="c1", chars=500))
        await barrier(conn)
        await output(conn, log, 1500)
        assert len(log.text) == 1500
        async with asyncio.timeout(10):
            while not log.ends:  # the Edge's side: credit back for what was relayed
                await conn.send(wire.Credit(run_id="c1", chars=1_000_000))
                await barrier(conn)
        assert log.ends[0].ok and log.text == good.requests[0].response.decode()


async def test_r_in_5_a_cancel_ends_a_run_that_waits_for_credit(edge, good, tmp_path):
    """R-IN-5: the upstream is done but its output waits for credit; cancel still ends it."""
    good.reply_text = "w" * 100_000
    async with running_node(edge, tmp_path):
        conn = await edge.next_connection()
        log = conn.run("c2")
        body = msgspec.json.encode(chat_body(stream=True)).decode()
        await conn.send(wire.RunBodyPart(run_id="c2", data=body))
        await conn.send(tunnel("c2", 1, credit=100, stream=True))
        await output(conn, log, 100)
        await conn.send(wire.Cancel(run_id="c2"))
        await conn.wait_end("c2")
        assert len(log.text) == 100
        assert len(log.ends) == 1
