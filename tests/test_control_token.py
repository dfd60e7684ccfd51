"""The control listener's optional bearer token, ``admin.token`` (docs/configuration.md, "admin"):
when set, /pool, /metrics and /refresh answer only a request that presents it."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from catalog.config import load_snapshot
from iop_site.control import ControlApp
from iop_site.runtime import EdgeRuntime
from tests.support.config import load_issues
from tests.support.config_examples import example_document

TOKEN = "ctl-7f3e9a1c5b2d4e6f"


async def runtime_with(token: dict[str, str] | None) -> EdgeRuntime:
    document = example_document()
    if token is not None:
        document["admin"]["token"] = token
    return EdgeRuntime(load_snapshot(document))


@pytest.fixture
async def with_env_token(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EdgeRuntime]:
    monkeypatch.setenv("IOP_TEST_ADMIN_TOKEN", TOKEN)
    runtime = await runtime_with({"env": "IOP_TEST_ADMIN_TOKEN"})
    yield runtime
    await runtime.aclose()


async def call(
    runtime: EdgeRuntime, path: str, *, method: str = "GET", bearer: str | None = None
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request to the control app from a loopback peer: (status, headers, body)."""
    headers = [(b"authorization", f"Bearer {bearer}".encode())] if bearer is not None else []
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50123),
        "server": ("127.0.0.1", 7701),
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await ControlApp(runtime)(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], dict(sent[0]["headers"]), body


@pytest.mark.parametrize("path", ["/pool", "/metrics", "/refresh"])
@pytest.mark.parametrize("bearer", [None, "wrong-token", TOKEN + "x"])
async def test_a_missing_or_wrong_admin_token_is_a_401_in_the_json_error_shape(
    with_env_token: EdgeRuntime, path: str, bearer: str | None
) -> None:
    method = "POST" if path == "/refresh" else "GET"
    status, headers, body = await call(with_env_token, path, method=method, bearer=bearer)
    assert status == 401 and headers[b"www-authenticate"] == b"Bearer"
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == ("invalid_api_key", "authentication_error")
    assert TOKEN.encode() not in body and (bearer is None or bearer.encode() not in body)


async def test_the_right_admin_token_opens_the_control_listener(
    with_env_token: EdgeRuntime,
) -> None:
    status, _, body = await call(with_env_token, "/pool", bearer=TOKEN)
    assert status == 200 and "providers" in json.loads(body)
    status, _, _ = await call(with_env_token, "/metrics", bearer=TOKEN)
    assert status == 200


async def test_without_admin_token_loopback_alone_is_enough() -> None:
    runtime = await runtime_with(None)
    try:
        status, _, _ = await call(runtime, "/pool")
        assert status == 200
    finally:
        await runtime.aclose()


async def test_a_file_token_is_read_per_request_so_rewriting_the_file_rotates_it(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")  # a trailing newline is never part of the token
    runtime = await runtime_with({"file": str(token_file)})
    try:
        assert (await call(runtime, "/pool", bearer=TOKEN))[0] == 200
        token_file.write_text("rotated-token-0a1b2c")
        assert (await call(runtime, "/pool", bearer=TOKEN))[0] == 401
        assert (await call(runtime, "/pool", bearer="rotated-token-0a1b2c"))[0] == 200
    finally:
        await runtime.aclose()


async def test_an_unreadable_admin_token_refuses_every_request_and_logs_only_the_reference(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "absent.token"
    runtime = await runtime_with({"file": str(missing)})
    try:
        with caplog.at_level(logging.WARNING, logger="iop_site.control"):
            assert (await call(runtime, "/pool", bearer=TOKEN))[0] == 401
        assert str(missing) in caplog.text and TOKEN not in caplog.text
    finally:
        await runtime.aclose()


def test_a_literal_admin_token_is_refused_at_load() -> None:
    """A secret is a reference, never a value written into the config (R-REF-6)."""
    document = example_document()
    document["admin"]["token"] = TOKEN
    issues = load_issues(document)
    assert [m.split(":")[0] for m in issues] == ["admin.token"]
    assert all(TOKEN not in m for m in issues)
