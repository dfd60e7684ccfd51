"""Fixtures shared by several test modules (registered in ``tests/conftest.py``).

Node-side tests: ``fake_openai`` / ``fake_ollama`` / ``fake_anthropic`` (a fake upstream on
loopback),
``upstream_client`` (the Node's upstream HTTP client), ``fake_edge`` (the Edge side of the
wire, sending one provider ``p1`` on ``fake_openai``). End-to-end modules that define a
``stack`` fixture get clients of it: ``http`` (httpx), ``oai`` (openai), ``ant`` (anthropic);
no retries, so a test sees exactly what the Edge answered.

``shared_stack(name, options)``: the two fixtures of a module whose tests share one ``Stack``
and inject faults into its upstreams: ``stack`` (module scope, built from ``options(directory)``)
and an autouse one that wraps every test in ``stack.clean_slate()`` (faults cleared, every lease
released, R-POOL-9). ``stack, _clean_slate = shared_stack("errors", lambda d: {...})``.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodes.agent.adapters.http import HttpClient
from tests.fakes import FakeAnthropic, FakeOllama, FakeOpenAI
from tests.fakes.edge import FakeEdge
from tests.support.payloads import node_payload, openai_provider


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """pytest-django's test database on a server (PostgreSQL) gets this checkout's suffix
    after xdist's ``_gwN``: ``test_iop_gw0_1a2b3c4d``. Checkouts on one machine share the
    server, and a run would otherwise drop the database another checkout's run is using."""
    from django.conf import settings

    checkout = hashlib.sha256(str(Path(__file__).resolve().parents[2]).encode()).hexdigest()[:8]
    for db in settings.DATABASES.values():
        if db["ENGINE"] == "django.db.backends.sqlite3":
            continue  # in memory, per process
        test = db.setdefault("TEST", {})
        test["NAME"] = f"{test.get('NAME') or 'test_' + db['NAME']}_{checkout}"


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


def shared_stack(name: str, options: Callable[[Path], dict[str, Any]]) -> tuple[Any, Any]:
    """A module's shared ``stack`` fixture and the autouse fixture that cleans it per test."""
    from tests.support.stack import Stack

    @pytest.fixture(scope="module", name="stack")
    def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
        directory = tmp_path_factory.mktemp(name)
        with Stack(directory, **options(directory)) as running:
            yield running

    @pytest.fixture(autouse=True, name="_clean_slate")
    def clean_slate(stack: Stack) -> Iterator[None]:
        with stack.clean_slate():  # R-POOL-9: every test ends with no lease held
            yield

    return stack, clean_slate


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
