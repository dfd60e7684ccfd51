"""Shared fixtures: the autouse one below, and those of ``tests.support.fixtures``."""

from __future__ import annotations

import os

import pytest

pytest_plugins = ["tests.support.fixtures"]

# The shipped example config and the test fixtures use published token hashes (sha256 of
# "test", "foo", "node-token"...), which load only with this opt-in; child processes
# (Edges, Nodes, commands) inherit it. docs/configuration.md, "Token hashes".
os.environ["IOP_ALLOW_EXAMPLE_TOKEN_HASHES"] = "1"


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
