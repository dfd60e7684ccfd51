"""The Edge side of the Node wire, through the real consumer (R-NODE-1..4, R-POOL-9)."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from channels.testing import WebsocketCommunicator

from catalog.config import load_snapshot
from iop_site.runtime import EdgeRuntime
from nodes import wire
from nodes.consumer import NodeConsumer
from nodes.runs import RunOrder
from pool.engine import Unavailable
from tests.support.config_examples import EXAMPLE_NODE_TOKEN, example_document

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


def two_node_document() -> dict:
    doc = example_document()
    second = {
        "id": "node-b",
        "token_hash_sha256": doc["nodes"][0]["token_hash_sha256"],
        "providers": [{"id": "cli-b", "type": "cli", "command": ["cat"], "capacity": 1}],
    }
    doc["nodes"].append(second)
    doc["models"].append({"id": "echo-b", "providers": {"cli-b": "echo"}})
    return doc


@pytest.fixture
def runtime() -> EdgeRuntime:
    return EdgeRuntime(load_snapshot(two_node_document()))


def communicator(runtime: EdgeRuntime, node_id: str = "node-a", token: str = EXAMPLE_NODE_TOKEN):
    headers = [(b"authorization", f"Bearer {token}".encode()), (b"x-iop-node-id", node_id.encode())]
    return WebsocketCommunicator(NodeConsumer.as_asgi(hub=runtime.hub), "/ws/node", headers=headers)


async def receive(comm: WebsocketCommunicator) -> wire.EdgeToNode:
    message = await comm.receive_output(timeout=5)
    assert message["type"] == "websocket.send", message
    return wire.decode_from_edge(message["bytes"])


async def register(
    comm: WebsocketCommunicator, node_id: str = "node-a", protocol: int = wire.PROTOCOL_VERSION
) -> wire.RegisterResponse:
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.send_to(bytes_data=wire.encode(wire.Register(node_id=node_id, protocol=protocol)))
    response = await receive(comm)
    assert isinstance(response, wire.RegisterResponse)
    return response


async def make_ready(
    comm: WebsocketCommunicator, node_id: str = "node-a", protocol: int = wire.PROTOCOL_VERSION
) -> wire.RegisterResponse:
    response = await register(comm, node_id, protocol)
    await comm.send_to(
        bytes_data=wire.encode(
            wire.Ready(generation=response.generation, revision=response.payload.revision)
        )
    )
    return response


async def settle(comm: WebsocketCommunicator) -> None:
    """Round-trip a ping so every frame sent before it has been handled."""
    await comm.send_to(bytes_data=wire.encode(wire.Ping(ts=1.0)))
    assert isinstance(await receive(comm), wire.Pong)


def online(runtime: EdgeRuntime, provider_id: str) -> bool:
    status = {p.provider_id: p for p in runtime.pool.snapshot().providers}
    return status[provider_id].online


async def test_bad_token_is_refused_before_accept_and_the_log_says_why(runtime, caplog):
    comm = communicator(runtime, token="not-the-token")
    connected, _ = await comm.connect(timeout=5)
    assert not connected
    assert runtime.hub.sessions == {}
    assert "node node-a refused: its token does not match" in caplog.text
    assert "not-the-token" not in caplog.text


async def test_unknown_node_is_refused_before_accept_and_the_log_says_why(runtime, caplog):
    comm = communicator(runtime, node_id="node-zzz")
    connected, _ = await comm.connect(timeout=5)
    assert not connected
    assert "node 'node-zzz' refused: it is not in the running revision" in caplog.text


async def test_register_response_carries_the_nodes_own_payload_provider_first(runtime):
    """R-NODE-2: the payload lists this node's providers with their runtime profile."""
    comm = communicator(runtime)
    response = await register(comm)
    providers = {p.id: p for p in response.payload.providers}
    assert set(providers) == {"compat-a", "ollama-a", "cli-a"}
    assert providers["compat-a"].adapter == "openai_compat"
    assert providers["compat-a"].operations["chat_completions"] == (
        "http://127.0.0.1:9001/v1/chat/completions"
    )
    assert providers["compat-a"].served_models == {"chat-model": "served-chat"}
    assert providers["cli-a"].command == ["cat"]
    await comm.disconnect()


def test_payload_compiles_for_a_profile_with_nested_extensions():
    """R-NODE-2, R-XLATE-3: the profile's extension headers (anthropic-version) are applied:
    they reach the payload as the provider's headers."""
    from nodes.payload import compile_payload

    doc = two_node_document()
    doc["nodes"][1]["providers"].append(
        {"id": "claude", "profile": "anthropic", "credential": {"env": "ANTHROPIC_KEY"}}
    )
    frame = wire.encode(
        wire.RegisterResponse(generation=1, payload=compile_payload(load_snapshot(doc), "node-b"))
    )
    payload = wire.decode_from_edge(frame).payload
    claude = next(p for p in payload.providers if p.id == "claude")
    assert claude.operations["messages"] == "https://api.anthropic.com/v1/messages"
    assert claude.headers == {"anthropic-version": "2023-06-01"}


async def test_pending_connection_is_not_a_candidate_until_ready(runtime):
    """R-NODE-1: accepted-but-pending is not connected and not dispatched to."""
    comm = communicator(runtime)
    await register(comm)
    assert not online(runtime, "cli-a")
    with pytest.raises(Unavailable):
        await runtime.pool.acquire("echo", frozenset({"chat"}))
    response = runtime.hub.sessions["node-a"]
    await comm.send_to(
        bytes_data=wire.encode(
            wire.Ready(generation=response.generation, revision=response.revision)
        )
    )
    await settle(comm)
    assert online(runtime, "cli-a")
    lease = await runtime.pool.acquire("echo", frozenset({"chat"}))
    assert lease.provider_id == "cli-a"
    runtime.pool.release(lease)
    await comm.disconnect()
    assert not online(runtime, "cli-a")


async def test_provider_health_is_the_snapshot_no_probe_is_made(runtime):
    """R-NODE-6: a ready Node's enabled providers are candidates with no active probe, even
    when their upstream (here 127.0.0.1:9001, nothing listening) would not answer."""
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    assert online(runtime, "compat-a")
    lease = await runtime.pool.acquire("chat-model", frozenset({"chat"}))
    assert lease.provider_id == "compat-a"
    runtime.pool.release(lease)
    await comm.disconnect()


async def test_ready_makes_a_queued_waiter_dispatchable() -> None:
    """R-POOL-5 / R-NODE-1: a waiter queued while node-b was not ready is dispatched on
    node-b by its ready transition, with node-a's slot still held."""
    doc = two_node_document()
    doc["models"].append({"id": "echo-both", "providers": {"cli-a": "echo", "cli-b": "echo"}})
    runtime = EdgeRuntime(load_snapshot(doc))
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    held = await runtime.pool.acquire("echo-both", frozenset({"chat"}))
    assert held.provider_id == "cli-a"
    waiter = asyncio.ensure_future(runtime.pool.acquire("echo-both", frozenset({"chat"})))
    await asyncio.sleep(0)
    assert runtime.pool.snapshot().queue_depth == 1 and not waiter.done()
    other = communicator(runtime, node_id="node-b")
    await make_ready(other, "node-b")
    await settle(other)
    second = await asyncio.wait_for(waiter, 5)
    assert second.provider_id == "cli-b"  # node-b's ready, not a release, let it run
    runtime.pool.release(held)
    runtime.pool.release(second)
    assert runtime.pool.idle()
    await comm.disconnect()
    await other.disconnect()


async def test_ready_without_register_closes_that_connection_only(runtime):
    other = communicator(runtime, node_id="node-b")
    await make_ready(other, "node-b")
    await settle(other)
    comm = communicator(runtime)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.send_to(bytes_data=wire.encode(wire.Ready(generation=99, revision="x")))
    error = await receive(comm)
    assert isinstance(error, wire.ErrorMessage) and error.code == "protocol_error"
    closed = await comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": wire.CLOSE_PROTOCOL_ERROR}
    await settle(other)
    assert online(runtime, "cli-b")
    await other.disconnect()


@pytest.mark.parametrize(
    "frame",
    [b"not json", b'{"type": "launch_missiles"}', b'{"type": "ready"}', b'{"type":"ping","x":1}'],
)
async def test_malformed_or_unknown_message_closes_with_a_reason(runtime, frame):
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    await comm.send_to(bytes_data=frame)
    error = await receive(comm)
    assert isinstance(error, wire.ErrorMessage) and "malformed" in error.message
    closed = await comm.receive_output(timeout=5)
    assert closed["code"] == wire.CLOSE_PROTOCOL_ERROR
    assert not online(runtime, "cli-a")


async def run_on(runtime: EdgeRuntime, model: str = "echo"):
    lease = await runtime.pool.acquire(model, frozenset({"chat"}))
    body = json.dumps({"model": "echo", "messages": []}).encode()
    channel = await runtime.hub.open_run(lease, RunOrder(False, "chat_completions", True, body))
    return lease, channel


async def test_run_events_flow_in_order_and_a_duplicated_run_end_is_ignored(runtime):
    """R-POOL-9: exactly one terminal per run even when the Node repeats it."""
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    lease, channel = await run_on(runtime)
    request = await receive(comm)
    assert isinstance(request, wire.RunRequest) and request.provider_id == "cli-a"
    assert msgspec.json.decode(request.body)["model"] == "echo"
    for message in (
        wire.RunEvent(run_id=request.run_id, data="a"),
        wire.RunEvent(run_id=request.run_id, data="b"),
        wire.RunEnd(run_id=request.run_id, ok=True, usage=wire.Usage(3, 4)),
        wire.RunEnd(run_id=request.run_id, ok=False, error=wire.RunError("x", "y")),
        wire.RunEvent(run_id=request.run_id, data="late"),
    ):
        await comm.send_to(bytes_data=wire.encode(message))
    await settle(comm)
    received = [await channel.get() for _ in range(3)]
    assert received[:2] == ["a", "b"]
    assert isinstance(received[2], wire.RunEnd) and received[2].ok
    assert channel.get_nowait() is None
    runtime.pool.release(lease)
    assert runtime.pool.idle()
    await comm.disconnect()


async def test_output_carried_in_run_end_is_read_before_the_end(runtime):
    """Protocol 2: a run_end's ``data`` is the run's last output, after its run_events; the
    channel reads it as an event, and the end it hands on carries none (nothing twice)."""
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    lease, channel = await run_on(runtime)
    request = await receive(comm)
    for message in (
        wire.RunEvent(run_id=request.run_id, data="head "),
        wire.RunEnd(run_id=request.run_id, ok=True, usage=wire.Usage(1, 2), data="tail"),
    ):
        await comm.send_to(bytes_data=wire.encode(message))
    await settle(comm)
    received = [await channel.get() for _ in range(3)]
    assert received[:2] == ["head ", "tail"]
    end = received[2]
    assert isinstance(end, wire.RunEnd) and end.ok and end.data == ""
    assert end.usage == wire.Usage(1, 2)
    runtime.pool.release(lease)
    assert runtime.pool.idle()
    await comm.disconnect()


async def test_a_run_end_whose_output_passes_the_window_fails_the_run(runtime, caplog):
    """R-IN-5: output in a run_end counts against the run's credit like a run_event's."""
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    lease = await runtime.pool.acquire("echo", frozenset({"chat"}))
    order = RunOrder(False, "chat_completions", False, b'{"model":"echo"}')
    channel = await runtime.hub.open_run(lease, order, window=10)
    request = await receive(comm)
    assert request.credit == 10
    end = wire.RunEnd(run_id=request.run_id, ok=True, data="x" * 11)
    await comm.send_to(bytes_data=wire.encode(end))
    cancel = await receive(comm)
    assert isinstance(cancel, wire.Cancel) and cancel.run_id == request.run_id
    failed = await channel.get()
    assert isinstance(failed, wire.RunEnd) and failed.error is not None
    assert failed.error.code == "upstream_error"
    assert any("overran its credit" in r.getMessage() for r in caplog.records)
    runtime.hub.close_run(channel)
    runtime.pool.release(lease)
    assert runtime.pool.idle()
    await comm.disconnect()


@pytest.mark.parametrize(
    ("protocol", "accepted"), [(1, True), (2, True), (3, True), (4, False), (0, False)]
)
async def test_a_node_of_protocol_1_to_3_registers_and_any_other_is_refused(
    runtime, protocol, accepted, caplog
):
    """An Edge is upgraded before its Nodes: a protocol 1 Node (no output in run_end)
    registers; a protocol the Edge does not know is refused with one line naming both
    versions, and the Edge's log says the same (R-HA-4)."""
    comm = communicator(runtime)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.send_to(bytes_data=wire.encode(wire.Register(node_id="node-a", protocol=protocol)))
    response = await receive(comm)
    if accepted:
        assert isinstance(response, wire.RegisterResponse)
        await comm.disconnect()
    else:
        assert isinstance(response, wire.ErrorMessage) and response.code == "unsupported_protocol"
        assert response.message.startswith(
            f"this Edge speaks wire protocol 1-3, the Node (agent unknown) protocol {protocol}: "
        )
        assert response.message in caplog.text
        closed = await comm.receive_output(timeout=5)
        assert closed["code"] == wire.CLOSE_PROTOCOL_ERROR


@pytest.mark.parametrize(("protocol", "sent"), [(1, False), (2, True)])
async def test_a_node_is_sent_only_the_fields_its_protocol_has_r_ha_4(runtime, protocol, sent):
    """``wire.FIELDS_SINCE``: a protocol 1 Node (which may refuse them) gets no request_id
    or traceparent; a protocol 2 Node gets both."""
    comm = communicator(runtime)
    await make_ready(comm, protocol=protocol)
    await settle(comm)
    lease = await runtime.pool.acquire("echo", frozenset({"chat"}))
    body = json.dumps({"model": "echo", "messages": []}).encode()
    trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    order = RunOrder(False, "chat_completions", True, body, request_id="req-1", traceparent=trace)
    channel = await runtime.hub.open_run(lease, order)
    frame = json.loads((await comm.receive_output(timeout=5))["bytes"])
    assert frame["type"] == "run_request"
    assert ("request_id" in frame, "traceparent" in frame) == (sent, sent)
    runtime.hub.close_run(channel)
    runtime.pool.release(lease)
    await comm.disconnect()


async def test_closing_an_unfinished_run_sends_cancel_to_the_node(runtime):
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    lease, channel = await run_on(runtime)
    request = await receive(comm)
    runtime.hub.close_run(channel)
    runtime.pool.release(lease)
    cancel = await receive(comm)
    assert isinstance(cancel, wire.Cancel) and cancel.run_id == request.run_id
    assert channel.end is not None and channel.end.error.code == "cancelled"
    assert runtime.pool.idle()
    await comm.disconnect()


async def test_disconnect_ends_that_generations_runs_with_node_gone(runtime):
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    lease, channel = await run_on(runtime)
    await receive(comm)
    await comm.disconnect()
    end = await asyncio.wait_for(channel.get(), 5)
    assert isinstance(end, wire.RunEnd) and end.error.code == "node_gone"
    runtime.pool.release(lease)
    assert runtime.pool.idle()
    assert not online(runtime, "cli-a")


async def test_a_consumer_that_fails_tells_the_hub_at_once_not_after_the_heartbeat(
    runtime, monkeypatch
):
    """R-NODE-1, R-POOL-9: an exception in the consumer still ends its generation: the
    providers go offline and the run ends as node_gone long before the heartbeat timeout."""
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    lease, channel = await run_on(runtime)
    await receive(comm)
    assert online(runtime, "cli-a") and "node-a" in runtime.hub.sessions

    async def broken(session, frame):
        raise RuntimeError("handler bug")

    monkeypatch.setattr(runtime.hub, "receive", broken)
    await comm.send_to(bytes_data=wire.encode(wire.Ping(ts=2.0)))
    with pytest.raises(RuntimeError, match="handler bug"):
        await comm.wait(timeout=5)  # the consumer ended with the exception
    assert "node-a" not in runtime.hub.sessions
    assert not online(runtime, "cli-a")
    end = channel.get_nowait()
    assert isinstance(end, wire.RunEnd) and end.error.code == "node_gone"
    runtime.pool.release(lease)
    assert runtime.pool.idle()


async def test_newest_connection_wins_and_the_old_generation_is_closed(runtime):
    old = communicator(runtime)
    first = await make_ready(old)
    await settle(old)
    lease, channel = await run_on(runtime)
    await receive(old)
    new = communicator(runtime)
    second = await register(new)
    assert second.generation > first.generation
    end = await asyncio.wait_for(channel.get(), 5)
    assert isinstance(end, wire.RunEnd) and end.error.code == "node_gone"
    closed = await old.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": wire.CLOSE_SUPERSEDED}
    runtime.pool.release(lease)
    assert not online(runtime, "cli-a")  # the new one is still pending
    await new.send_to(
        bytes_data=wire.encode(
            wire.Ready(generation=second.generation, revision=second.payload.revision)
        )
    )
    await settle(new)
    assert online(runtime, "cli-a")
    await old.disconnect()  # the late disconnect of the old generation changes nothing
    assert online(runtime, "cli-a")
    await new.disconnect()
    assert runtime.pool.idle()


async def test_refresh_pushes_to_ready_nodes_whose_payload_changed_only(runtime):
    """R-NODE-4 and R-REF-5."""
    ready = communicator(runtime)
    await make_ready(ready)
    await settle(ready)
    pending = communicator(runtime, node_id="node-b")
    await register(pending, "node-b")

    same = await runtime.apply(load_snapshot(two_node_document()))
    assert same.pushed_nodes == ()

    doc = two_node_document()
    doc["nodes"][0]["providers"][0]["capacity"] = 5  # pool-only change: payload unchanged
    doc["models"][0]["providers"]["compat-a"] = "served-chat-v2"  # payload changes for node-a
    doc["nodes"][1]["providers"][0]["priority"] = 3
    doc["models"][2]["providers"]["cli-b"] = "echo-v2"  # would change node-b, but it is pending
    outcome = await runtime.apply(load_snapshot(doc))
    assert outcome.pushed_nodes == ("node-a",)
    refresh = await receive(ready)
    assert isinstance(refresh, wire.ConfigRefresh)
    compat = next(p for p in refresh.payload.providers if p.id == "compat-a")
    assert compat.served_models == {"chat-model": "served-chat-v2"}
    assert await pending.receive_nothing(timeout=0.2)
    await ready.disconnect()
    await pending.disconnect()


async def test_a_node_pending_during_a_refresh_gets_the_new_payload_at_ready(runtime):
    comm = communicator(runtime, node_id="node-b")
    response = await register(comm, "node-b")
    doc = two_node_document()
    doc["models"][2]["providers"]["cli-b"] = "echo-v2"
    await runtime.apply(load_snapshot(doc))
    await comm.send_to(
        bytes_data=wire.encode(
            wire.Ready(generation=response.generation, revision=response.payload.revision)
        )
    )
    refresh = await receive(comm)
    assert isinstance(refresh, wire.ConfigRefresh)
    assert refresh.payload.providers[0].served_models == {"echo-b": "echo-v2"}
    await comm.disconnect()


async def test_a_silent_node_is_declared_gone_after_the_heartbeat_timeout():
    runtime = EdgeRuntime(
        load_snapshot(two_node_document()), heartbeat_interval_s=0.05, heartbeat_timeout_s=0.2
    )
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    assert online(runtime, "cli-a")
    while True:  # pings arrive; the node never answers
        message = await comm.receive_output(timeout=5)
        if message["type"] == "websocket.close":
            break
        assert isinstance(wire.decode_from_edge(message["bytes"]), wire.Ping)
    assert message["code"] == wire.CLOSE_HEARTBEAT_TIMEOUT
    assert not online(runtime, "cli-a")
    await runtime.aclose()


async def test_a_refused_refresh_is_pushed_again_by_the_next_apply(runtime):
    """R-NODE-4: a Node that acked a refresh with ok=false gets the payload again."""
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    doc = two_node_document()
    doc["models"][0]["providers"]["compat-a"] = "served-chat-v2"
    await runtime.apply(load_snapshot(doc))
    refresh = await receive(comm)
    assert isinstance(refresh, wire.ConfigRefresh)
    ack = wire.ConfigRefreshAck(revision=refresh.payload.revision, ok=False, error="env X unset")
    await comm.send_to(bytes_data=wire.encode(ack))
    await settle(comm)
    again = await runtime.apply(load_snapshot(doc))  # the same document
    assert again.pushed_nodes == ("node-a",)
    assert isinstance(await receive(comm), wire.ConfigRefresh)
    await comm.disconnect()


def health(runtime: EdgeRuntime, provider_id: str) -> tuple[str, int]:
    row = next(p for p in runtime.pool.snapshot().providers if p.provider_id == provider_id)
    return row.health, row.consecutive_failures


async def test_probe_results_reach_the_pool_only_for_the_nodes_own_providers(runtime):
    """R-HEALTH-3: node-a's probes count for its providers; node-b cannot speak for them."""
    comm = communicator(runtime)
    other = communicator(runtime, node_id="node-b")
    await make_ready(comm)
    await make_ready(other, "node-b")
    failing = wire.ProbeResult(provider_id="cli-a", ok=False, reason="x" * 5000)
    await other.send_to(bytes_data=wire.encode(failing))
    await settle(other)
    assert health(runtime, "cli-a") == ("healthy", 0)
    await comm.send_to(bytes_data=wire.encode(failing))
    await settle(comm)
    assert health(runtime, "cli-a") == ("healthy", 1)
    for _ in range(2):
        await comm.send_to(bytes_data=wire.encode(failing))
    await settle(comm)
    row = next(p for p in runtime.pool.snapshot().providers if p.provider_id == "cli-a")
    assert row.health == "ejected"
    assert len(row.health_reason) < 300  # a Node's reason is bounded before it is shown
    await comm.disconnect()
    await other.disconnect()


async def test_r_in_6_a_nodes_huge_or_negative_usage_is_counted_as_zero_with_a_log_line(
    runtime, caplog
):
    """R-IN-6: 2**63 and -5 from a Node reach the request as 0, and the run still ends ok."""
    comm = communicator(runtime)
    await make_ready(comm)
    await settle(comm)
    lease, channel = await run_on(runtime)
    request = await receive(comm)
    end = wire.RunEnd(run_id=request.run_id, ok=True, usage=wire.Usage(2**63, -5))
    await comm.send_to(bytes_data=wire.encode(end))
    await settle(comm)
    received = await channel.get()
    assert isinstance(received, wire.RunEnd) and received.ok
    assert received.usage == wire.Usage(0, 0)
    assert "out of range; counted as 0" in caplog.text
    runtime.pool.release(lease)
    await comm.disconnect()


async def test_run_ids_differ_between_two_edge_processes():
    """Ids derived from run ids (``chatcmpl-<run id>``) never repeat after a restart."""
    ids = []
    for _ in range(2):
        runtime = EdgeRuntime(load_snapshot(two_node_document()))  # one Edge process each
        comm = communicator(runtime)
        await make_ready(comm)
        await settle(comm)
        lease, _ = await run_on(runtime)
        request = await receive(comm)
        ids.append(request.run_id)
        runtime.pool.release(lease)
        await comm.disconnect()
        await runtime.aclose()
    assert ids[0] != ids[1]
