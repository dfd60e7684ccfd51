"""The Edge imports its URL conf on the first request that needs it, in a thread: the event
loop serves on meanwhile, requests arriving during the import wait for that one import, and
a failed import fails the requests that need it (a JSON 500, one log line) without being
taken for loaded."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import pytest

from iop_site import asgi


class Resolver:
    """A URL conf whose import blocks until released, counting imports."""

    def __init__(self, fail: bool = False) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.imports = 0
        self.fail = fail

    @property
    def url_patterns(self) -> list[Any]:
        self.imports += 1
        self.started.set()
        self.release.wait(30)
        if self.fail:
            raise ImportError("a broken view module")
        return []


def served_site() -> tuple[list[str], asgi.ASGIApp]:
    served: list[str] = []

    async def site(scope: Any, receive: Any, send: Any) -> None:
        served.append(scope["path"])

    return served, site


async def test_requests_during_the_import_wait_for_one_import_while_the_loop_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resolver = Resolver()
    monkeypatch.setattr("django.urls.get_resolver", lambda: resolver)
    served, site = served_site()
    app = asgi.urls_loaded_off_the_loop(site)

    first = [asyncio.ensure_future(app({"path": f"/admin/{n}"}, None, None)) for n in range(3)]
    # reached only if the loop runs on while the import is held in its thread
    assert await asyncio.to_thread(resolver.started.wait, 30)
    await asyncio.sleep(0)
    assert served == [] and not any(task.done() for task in first)

    resolver.release.set()
    await asyncio.gather(*first)
    assert sorted(served) == ["/admin/0", "/admin/1", "/admin/2"]
    await app({"path": "/admin/later"}, None, None)
    assert served[-1] == "/admin/later" and resolver.imports == 1


async def test_a_failed_import_fails_the_request_and_is_not_taken_for_loaded(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each request that needs the URL conf gets the OpenAI-shaped 500 ``internal_error``;
    the log has one line naming the exception's type, not its text or a trace."""
    resolver = Resolver(fail=True)
    resolver.release.set()
    monkeypatch.setattr("django.urls.get_resolver", lambda: resolver)
    served, site = served_site()
    app = asgi.urls_loaded_off_the_loop(site)
    for _ in range(2):
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
            sent.append(message)

        with caplog.at_level(logging.ERROR, logger="iop.nodes"):
            await app({"path": "/admin/"}, None, send)
        assert sent[0]["status"] == 500
        error = json.loads(sent[1]["body"])["error"]
        assert error["code"] == "internal_error" and error["type"] == "server_error"
    assert served == [] and resolver.imports == 1
    assert "a broken view module" not in caplog.text and "Traceback" not in caplog.text
    assert "failed to load: ImportError" in caplog.text
