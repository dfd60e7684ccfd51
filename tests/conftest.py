"""Shared fixtures: the autouse one below, and those of ``tests.support.fixtures``."""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.support.fixtures"]


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
