"""Edge <-> Node data path edge cases: a heartbeat before register_response, and a forwarded
caller credential echoed back by the upstream (R-NODE-1, R-AUTH-2)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from catalog.config import load_snapshot
from nodes import wire
from nodes.agent.adapters.base import AdapterError, RunSpec
from nodes.agent.adapters.http import HttpClient
from nodes.agent.adapters.openai_compat import OpenAICompatAdapter
from nodes.hub import NodeHub
from pool.engine import ProviderPool
from pool.policy import policy_from_snapshot
from tests.fakes import FakeOpenAI
from tests.fakes.edge import FakeEdge
from tests.support.inprocess import document
from tests.support.node_agent import running_node
from tests.support.payloads import chat_body, node_payload, openai_provider

WAIT = 5.0


class Frames:
    """A hub transport that keeps every frame and signals each one."""

    def __init__(self) -> None:
        self.sent: list[wire.EdgeToNode] = []
        self.changed = asyncio.Event()

    async def send(self, frame: bytes) -> None:
        self.sent.append(wire.decode_from_edge(frame))
        self.changed.set()

    async def close(self, code: int) -> None:
        pass

    async def first(self) -> wire.EdgeToNode:
        async with asyncio.timeout(WAIT):
            while not self.sent:
                self.changed.clear()
                await self.changed.wait()
        return self.sent[0]


async def test_the_first_frame_to_a_new_node_is_register_response_r_node_1() -> None:
    doc = document()
    doc["nodes"].append(
        {
            **doc["nodes"][0],
            "id": "n2",
            "providers": [{"id": "p2", "profile": "ollama", "base_url": "http://127.0.0.1:9"}],
        }
    )
    snapshot = load_snapshot(doc)
    pool = ProviderPool(policy_from_snapshot(snapshot))
    hub = NodeHub(lambda: snapshot, pool, heartbeat_interval_s=0.01)
    try:
        ready, pending = Frames(), Frames()
        session = await hub.connect("n1", ready)
        await hub.receive(
            session, wire.encode(wire.Register(node_id="n1", protocol=wire.PROTOCOL_VERSION))
        )
        response = await ready.first()
        assert isinstance(response, wire.RegisterResponse)
        generation, revision = response.generation, response.payload.revision
        await hub.receive(
            session, wire.encode(wire.Ready(generation=generation, revision=revision))
        )
        newcomer = await hub.connect("n2", pending)
        # A heartbeat tick passes while the newcomer's register is still on its way.
        async with asyncio.timeout(WAIT):
            while not any(isinstance(f, wire.Ping) for f in ready.sent):
                ready.changed.clear()
                await ready.changed.wait()
        await hub.receive(
            newcomer, wire.encode(wire.Register(node_id="n2", protocol=wire.PROTOCOL_VERSION))
        )
        first = await pending.first()
        assert isinstance(first, wire.RegisterResponse), type(first).__name__
    finally:
        await hub.aclose()


class PingBeforeRegisterResponse(FakeEdge):
    """An Edge whose heartbeat tick lands between accept and register_response."""

    async def _handle(self, ws: Any) -> None:
        real_send = ws.send
        pinged = False

        async def send(data: Any, *args: Any, **kw: Any) -> None:
            nonlocal pinged
            if not pinged:
                pinged = True
                await real_send(wire.encode(wire.Ping(ts=1.0)), text=True)
            await real_send(data, *args, **kw)

        ws.send = send
        await super()._handle(ws)


async def test_a_node_registers_when_a_ping_arrives_before_register_response(tmp_path) -> None:
    async with FakeOpenAI() as upstream:
        payload = node_payload(openai_provider(upstream.url, pid="p1"))
        async with PingBeforeRegisterResponse(payload) as edge, running_node(edge, tmp_path):
            conn = await edge.next_connection(within=2.0)
            kinds = [type(message) for message in conn.received]
            assert kinds[:3] == [wire.Register, wire.Pong, wire.Ready]


async def test_an_echoed_forwarded_credential_is_redacted_from_the_error_r_auth_2() -> None:
    raw = "sk-caller-forwarded-0123456789"
    async with FakeOpenAI() as upstream:
        upstream.faults.status = 401
        upstream.faults.error_message = f"Incorrect API key provided: {raw}"
        http = HttpClient()
        try:
            adapter = OpenAICompatAdapter(openai_provider(upstream.url), http)
            spec = RunSpec(
                run_id="r1",
                operation="chat_completions",
                stream=False,
                body=msgspec.json.encode(chat_body()),
                forward_headers={"Authorization": f"Bearer {raw}"},  # as the Edge forwards it
            )
            with pytest.raises(AdapterError) as err:
                await adapter.run(spec, lambda text: None)
        finally:
            await http.aclose()
    assert upstream.requests[0].headers["authorization"] == f"Bearer {raw}"
    assert raw not in err.value.message


def test_every_field_of_the_version_table_is_an_optional_field_of_its_message_r_ha_4() -> None:
    """``wire.FIELDS_SINCE`` names real fields with defaults (a field a peer may lack must be
    one it can be left without), for versions up to this one."""

    tags = {str(t.__struct_config__.tag): t for t in (wire.RunEnd, wire.RunRequest,
                                                       wire.TunnelRequest)}  # fmt: skip
    for tag, fields in wire.FIELDS_SINCE.items():
        info = {f.name: f for f in msgspec.structs.fields(tags[tag])}
        for name, since in fields.items():
            assert not info[name].required and 1 <= since <= wire.PROTOCOL_VERSION
    end = wire.RunEnd(run_id="r", ok=True, data="tail")
    assert b'"data"' not in wire.encode(wire.for_protocol(end, 1))
    assert wire.for_protocol(end, 2) is end


def test_a_node_sends_cached_input_tokens_only_to_an_edge_of_protocol_3_r_cost_1() -> None:
    """R-COST-1, R-HA-4: an Edge before 3 refuses unknown fields, so a Node's usage reaches
    it without ``cached_input_tokens`` (its other figures unchanged); an Edge of 3 gets all.
    An Edge is of 3 when it chose the wire subprotocol in the handshake."""
    assert wire.edge_protocol(wire.WIRE_SUBPROTOCOL) == 3
    assert wire.edge_protocol(None) == 2
    usage = wire.Usage(input_tokens=100, output_tokens=7, cached_input_tokens=60)
    end = wire.RunEnd(run_id="r", ok=True, usage=usage)
    older = msgspec.json.decode(wire.encode(wire.for_edge(end, 2)))
    assert older["usage"] == {"input_tokens": 100, "output_tokens": 7}
    assert wire.for_edge(end, 3) is end
    assert wire.decode_from_node(wire.encode(end)) == end
    ping = wire.Pong(ts=1.0)
    assert wire.for_edge(ping, 1) is ping


def test_a_routed_runs_cached_tokens_travel_beside_its_end_message_r_cost_1() -> None:
    """R-COST-1 across Edges: the End of a run routed through Redis carries its usage without
    the cached figure in ``m`` (an Edge of the previous version decodes it) and the figure in
    a field of its own, read back by this version; sane_usage bounds it by the input."""
    from nodes.remote_wire import End, entry, read_entry
    from nodes.tokens import sane_usage

    end = End("r", True, usage=wire.Usage(input_tokens=100, output_tokens=7,
                                          cached_input_tokens=60))  # fmt: skip
    fields = entry(end)
    assert b"cached" not in fields[b"m"] and fields[b"c"] == b"60"
    assert read_entry(fields) == end
    plain = End("r", True, usage=wire.Usage(input_tokens=1, output_tokens=2))
    assert set(entry(plain)) == {b"m"} and read_entry(entry(plain)) == plain
    odd = wire.Usage(input_tokens=10, output_tokens=1, cached_input_tokens=50)
    assert sane_usage(odd, "test") == wire.Usage(input_tokens=10, output_tokens=1,
                                                 cached_input_tokens=10)  # fmt: skip
