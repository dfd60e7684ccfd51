"""Shared fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _close_sync_thread_connections(request):
    """Async tests run ORM code on asgiref's one shared worker thread; close its connections
    after a database test so PostgreSQL can drop the test database at the end."""
    yield
    if request.node.get_closest_marker("django_db") is None:
        return
    from asgiref.sync import SyncToAsync
    from django.db import connections

    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)


# Clients of an end-to-end Edge, for test modules that define a ``stack`` fixture
# (tests.harness.Stack). No retries: a test sees exactly what the Edge answered.


@pytest.fixture
def http(stack):
    import httpx

    headers = {"authorization": f"Bearer {stack.token}"}
    with httpx.Client(base_url=stack.openai_url, timeout=20, headers=headers) as client:
        yield client


@pytest.fixture
def oai(stack):
    import openai

    with openai.OpenAI(
        base_url=stack.v1_url, api_key=stack.token, max_retries=0, timeout=20
    ) as client:
        yield client


@pytest.fixture
def ant(stack):
    import anthropic

    with anthropic.Anthropic(
        base_url=stack.openai_url, api_key=stack.token, max_retries=0, timeout=20
    ) as client:
        yield client
