"""Fixtures shared by several test modules (registered in ``tests/conftest.py``).

Node-side tests: ``fake_openai`` / ``fake_ollama`` / ``fake_anthropic`` (a fake upstream on
loopback),
``upstream_client`` (the Node's upstream HTTP client), ``fake_edge`` (the Edge side of the
wire, sending one provider ``p1`` on ``fake_openai``). End-to-end modules that define a
``stack`` fixture get clients of it: ``http`` (httpx), ``oai`` (openai), ``ant`` (anthropic);
no retries, so a test sees exactly what the Edge answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from nodes.agent.adapters.http import HttpClient
from tests.fakes import FakeAnthropic, FakeOllama, FakeOpenAI
from tests.fakes.edge import FakeEdge
from tests.support.payloads import node_payload, openai_provider


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def fake_ollama() -> AsyncIterator[FakeOllama]:
    async with FakeOllama() as server:
        yield server


@pytest.fixture
async def fake_anthropic() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as server:
        yield server


@pytest.fixture
async def upstream_client() -> AsyncIterator[HttpClient]:
    client = HttpClient()
    yield client
    await client.aclose()


@pytest.fixture
async def fake_edge(fake_openai: FakeOpenAI) -> AsyncIterator[FakeEdge]:
    async with FakeEdge(node_payload(openai_provider(fake_openai.url, pid="p1"))) as edge:
        yield edge


@pytest.fixture
def http(stack: Any) -> Iterator[Any]:
    import httpx

    headers = {"authorization": f"Bearer {stack.token}"}
    with httpx.Client(base_url=stack.openai_url, timeout=20, headers=headers) as client:
        yield client


@pytest.fixture
def oai(stack: Any) -> Iterator[Any]:
    import openai

    with openai.OpenAI(
        base_url=stack.v1_url, api_key=stack.token, max_retries=0, timeout=20
    ) as client:
        yield client


@pytest.fixture
def ant(stack: Any) -> Iterator[Any]:
    import anthropic

    with anthropic.Anthropic(
        base_url=stack.openai_url, api_key=stack.token, max_retries=0, timeout=20
    ) as client:
        yield client
