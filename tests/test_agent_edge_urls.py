"""A Node given several Edges (``edge_urls``, docs/node.md): validated like ``edge_url``, each
error naming its place in the list; tried in turn when a connection is lost (R-SCALE-3)."""

from __future__ import annotations

import pytest

from nodes import wire
from nodes.agent.client import Backoff
from nodes.agent.config import NodeConfigError, parse_config
from tests.fakes.edge import FakeEdge
from tests.support.node_agent import running_node
from tests.support.payloads import node_payload, openai_provider

A = "ws://127.0.0.1:7700/ws/node"
B = "ws://127.0.0.1:7701/ws/node"


def doc(**extra: object) -> dict[str, object]:
    return {"node_id": "node-a", "token": {"env": "IOP_NODE_TOKEN"}, **extra}


def errors_of(data: dict[str, object]) -> list[str]:
    with pytest.raises(NodeConfigError) as err:
        parse_config(data)
    return err.value.errors


def test_edge_urls_are_dialled_in_the_order_given():
    assert parse_config(doc(edge_urls=[A, B])).urls == (A, B)
    assert parse_config(doc(edge_url=A)).urls == (A,)


def test_edge_url_and_edge_urls_together_are_refused():
    assert errors_of(doc(edge_url=A, edge_urls=[B])) == [
        "edge_urls: give edge_url or edge_urls, not both"
    ]


def test_neither_edge_url_nor_edge_urls_is_refused():
    assert errors_of(doc()) == ["edge_url: is required (or edge_urls: a list of Edge URLs)"]


def test_an_empty_edge_urls_list_is_refused():
    assert errors_of(doc(edge_urls=[])) == ["edge_urls: must have at least 1 item(s)"]


def test_each_edge_url_in_the_list_is_checked_and_named_by_its_index():
    errors = errors_of(doc(edge_urls=[A, "http://edge/ws/node", "ws://127.0.0.1:7702/"]))
    assert errors == [
        "edge_urls[1]: must start with ws:// or wss://",
        "edge_urls[2]: the path must end in /ws/node (ws://EDGE_HOST:PORT/ws/node)",
    ]


def test_plaintext_to_a_remote_edge_in_the_list_is_refused_naming_its_index_r_tls_2():
    errors = errors_of(doc(edge_urls=[A, "ws://edge-b.example:7700/ws/node"]))
    assert len(errors) == 1 and errors[0].startswith("edge_urls[1]: ws:// to edge-b.example ")
    allowed = doc(edge_urls=[A, "ws://edge-b.example:7700/ws/node"], allow_plaintext=True)
    assert parse_config(allowed).urls[1] == "ws://edge-b.example:7700/ws/node"


async def test_a_node_that_loses_its_edge_moves_to_the_next_one_at_once_and_back(
    fake_openai, tmp_path
):
    """The backoff is long (60 s) and only between whole rounds: losing one Edge of two
    moves the Node to the other straight away, in both directions."""
    payload = node_payload(openai_provider(fake_openai.url, pid="p1"))
    async with FakeEdge(payload) as first, FakeEdge(payload) as second:
        urls = {"edge_url": None, "edge_urls": [first.url, second.url]}
        async with running_node(
            first, tmp_path, config=urls, backoff=Backoff(initial=60, cap=60)
        ) as client:
            on_first = await first.next_connection()
            await on_first.ws.close(1001, "edge going away")
            on_second = await second.next_connection()
            assert client.generation == on_second.generation
            assert on_second.received[1] == wire.Ready(
                generation=on_second.generation, revision=payload.revision
            )
            await on_second.ws.close(1001, "edge going away")
            back = await first.next_connection()
            assert client.generation == back.generation


async def test_when_every_edge_is_down_the_node_keeps_trying_them_in_turn(fake_openai, tmp_path):
    payload = node_payload(openai_provider(fake_openai.url, pid="p1"))
    async with FakeEdge(payload) as second:
        down = FakeEdge(payload)
        await down.start()
        dead_url = down.url
        await down.close()  # nothing listens there any more
        urls = {"edge_url": None, "edge_urls": [dead_url, second.url]}
        async with running_node(second, tmp_path, config=urls):
            conn = await second.next_connection()
            assert conn.received[0] == wire.Register(
                node_id=second.node_id,
                protocol=wire.PROTOCOL_VERSION,
                agent_version=conn.received[0].agent_version,
            )
