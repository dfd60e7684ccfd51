"""Shared fixtures: the autouse one below, and those of ``tests.support.fixtures``."""

from __future__ import annotations

import os

import pytest

# tests.support.timing: CPU seconds, worker and start of each test in a --junitxml report
pytest_plugins = ["tests.support.fixtures", "tests.support.timing"]

# The shipped example config and the test fixtures use published token hashes (sha256 of
# "test", "foo", "node-token"...), which load only with this opt-in; child processes
# (Edges, Nodes, commands) inherit it. docs/configuration.md, "Token hashes".
os.environ["IOP_ALLOW_EXAMPLE_TOKEN_HASHES"] = "1"


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing():
    """Passwords of in-process tests are hashed with MD5 (Django's advice for tests): the
    real PBKDF2 costs about half a second of CPU per login here. The Edges that end-to-end
    tests start keep the real hashers."""
    from django.conf import settings
    from django.contrib.auth.hashers import get_hashers

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    get_hashers.cache_clear()


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


# Longest module first, the modules that mostly wait spread among the others (tests/support/
# schedule.py, tests/module_times.json measured by scripts/test_times.py): `make test` hands
# whole modules to its workers in collection order (--dist loadfile with
# --no-loadscope-reorder), so the long end-to-end modules start at once and the short ones
# fill the gaps at the end. docs/testing.md.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from tests.support.schedule import order, read_times

    modules = [item.nodeid.split("::", 1)[0] for item in items]
    rank = {module: index for index, module in enumerate(order(modules, read_times()))}
    items.sort(key=lambda item: rank[item.nodeid.split("::", 1)[0]])
