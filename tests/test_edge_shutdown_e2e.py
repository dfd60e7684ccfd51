"""Stopping the Edge (SIGTERM): the public listener stops taking requests, running and
queued requests finish, Node sessions close and the last usage rows are written."""

from __future__ import annotations

import signal
import sqlite3
import threading

import httpx
import pytest

from tests.support import TOKEN_REF, Stack

pytestmark = pytest.mark.slow


def test_sigterm_drains_running_requests_then_writes_usage_and_exits(tmp_path) -> None:
    providers = [{"id": "p", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1}]
    stack = Stack(tmp_path, providers=providers, models=[{"id": "m", "providers": {"p": "m"}}])
    with stack:
        upstream = stack.upstream()
        upstream.server.faults.stall_before_first_byte = 1.0  # each request takes a second
        replies: list[httpx.Response] = []

        def ask() -> None:
            replies.append(
                httpx.post(
                    stack.v1_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {stack.token}"},
                    json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                    timeout=20,
                )
            )

        clients = [threading.Thread(target=ask) for _ in range(2)]  # one runs, one queues
        for client in clients:
            client.start()
        stack.wait_until(lambda snap: snap["queue_depth"] == 1, timeout=10)
        health = httpx.get(stack.v1_url.removesuffix("/v1") + "/healthz", timeout=5)
        assert (health.status_code, health.json()) == (200, {"status": "ok"})  # no token
        edge = stack.edge.popen
        edge.send_signal(signal.SIGTERM)
        for client in clients:
            client.join(timeout=20)
        assert [r.status_code for r in replies] == [200, 200]
        assert edge.wait(timeout=20) == 0
    with sqlite3.connect(tmp_path / "edge.sqlite3") as db:
        rows = db.execute(  # summed: requests either side of an hour land in two buckets
            "select token_ref, attributed_to, sum(requests) from pool_usagebucket"
            " group by token_ref, attributed_to"
        )
        assert rows.fetchall() == [(TOKEN_REF, "p", 2)]
    assert "Traceback" not in stack.logs()
