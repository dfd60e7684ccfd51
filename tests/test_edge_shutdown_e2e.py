"""Stopping the Edge (SIGTERM) closes its Node sessions and writes the last usage rows
instead of dropping them with the process."""

from __future__ import annotations

import signal
import sqlite3

import openai
import pytest

from tests.harness import TOKEN_REF, Stack

pytestmark = pytest.mark.slow


def test_sigterm_writes_pending_usage_and_exits_cleanly(tmp_path) -> None:
    providers = [{"id": "p", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1}]
    stack = Stack(tmp_path, providers=providers, models=[{"id": "m", "providers": {"p": "m"}}])
    with stack:
        with openai.OpenAI(base_url=stack.v1_url, api_key=stack.token, max_retries=0) as client:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        edge = stack.edge.popen
        edge.send_signal(signal.SIGTERM)
        assert edge.wait(timeout=20) == 0
    with sqlite3.connect(tmp_path / "edge.sqlite3") as db:
        rows = db.execute(
            "select token_ref, attributed_to, requests from pool_usagebucket"
        ).fetchall()
    assert rows == [(TOKEN_REF, "p", 1)]
    assert "Traceback" not in stack.logs()
