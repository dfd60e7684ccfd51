"""POST /refresh on the admin listener (R-REF-1): loopback only, dry-run or apply, reports that
never carry a secret (R-REF-6)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import yaml
from asgiref.sync import sync_to_async

from iop_site import control_refresh as endpoint
from iop_site.control import ControlApp
from iop_site.control_refresh import handle_refresh
from iop_site.runtime import EdgeRuntime
from refresh.models import ConfigRevision
from refresh.startup import startup_snapshot
from tests.support.config import provider
from tests.support.processes import EDGE_YAML

pytestmark = pytest.mark.django_db(transaction=True)
LOOPBACK = ("127.0.0.1", 50123)


@pytest.fixture
async def edge(transactional_db):
    runtime = EdgeRuntime(await sync_to_async(startup_snapshot)(str(EDGE_YAML)))
    yield runtime
    await runtime.aclose()


async def call(
    app: Any,
    body: bytes,
    *,
    client: tuple[str, int] | None = LOOPBACK,
    method: str = "POST",
    query: str = "",
    content_type: str = "application/json",
    headers: tuple[tuple[bytes, bytes], ...] = (),
    chunk: int | None = None,
) -> tuple[int, dict]:
    """One ASGI request to ``app``; returns (status, JSON body)."""
    scope = {
        "type": "http",
        "method": method,
        "path": "/refresh",
        "query_string": query.encode(),
        "headers": [(b"content-type", content_type.encode()), *headers],
        "client": client,
        "server": ("127.0.0.1", 7701),
    }
    size = chunk or max(len(body), 1)
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = sent[0]["status"]
    return status, json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def envelope(mode: str, document: dict, **extra: Any) -> bytes:
    return json.dumps({"mode": mode, "config": document, **extra}).encode()


def handler(runtime: EdgeRuntime) -> Any:
    return lambda scope, receive, send: handle_refresh(runtime, scope, receive, send)


# --- loopback only -------------------------------------------------------------------------------


@pytest.mark.parametrize("client", [("10.1.2.3", 5555), ("192.168.1.20", 40000), None])
async def test_a_non_loopback_peer_is_refused_by_the_handler_itself(edge, client):
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = 9
    status, body = await call(handler(edge), envelope("apply", document), client=client)
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert edge.snapshot.providers["vllm-local"].capacity == 4
    assert await ConfigRevision.objects.acount() == 1


async def test_a_forwarded_for_header_never_makes_a_request_local(edge):
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = 9
    spoof = (
        (b"x-forwarded-for", b"127.0.0.1"),
        (b"x-real-ip", b"127.0.0.1"),
        (b"forwarded", b"for=127.0.0.1"),
    )
    for app in (handler(edge), ControlApp(edge)):
        status, _ = await call(
            app, envelope("apply", document), client=("10.1.2.3", 5555), headers=spoof
        )
        assert status == 403
    assert edge.snapshot.providers["vllm-local"].capacity == 4


async def test_an_ipv6_loopback_peer_is_served(edge):
    status, body = await call(
        handler(edge), envelope("dry_run", edge.snapshot.document), client=("::1", 5555)
    )
    assert status == 200 and body["changed"] is False


async def test_only_post_is_allowed(edge):
    status, _ = await call(handler(edge), b"", method="GET")
    assert status == 405


# --- dry-run and apply ---------------------------------------------------------------------------


async def test_a_json_dry_run_reports_and_changes_nothing(edge):
    before = edge.snapshot
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = 9
    status, body = await call(ControlApp(edge), envelope("dry_run", document))
    assert status == 200 and body["mode"] == "dry_run" and body["applied"] is False
    assert body["live_paths"] == ['nodes["node-local"].providers["vllm-local"].capacity']
    assert edge.snapshot is before
    assert await ConfigRevision.objects.acount() == 1


async def test_a_yaml_document_with_mode_apply_is_applied_and_recorded(edge):
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = 9
    status, body = await call(
        ControlApp(edge),
        yaml.safe_dump(document).encode(),
        query="mode=apply",
        content_type="application/yaml",
    )
    assert status == 200 and body["applied"] is True, body
    assert edge.snapshot.providers["vllm-local"].capacity == 9
    revision = await ConfigRevision.objects.aget(is_active=True)
    assert revision.pk == body["revision"] == body["active"] != body["parent"]  # what runs now
    assert (revision.source, revision.author_label) == ("refresh", endpoint.AUTHOR)


async def test_a_restart_required_apply_answers_409_with_the_report(edge):
    document = edge.snapshot.document
    document["admin"]["listen"] = "127.0.0.1:7799"
    status, body = await call(handler(edge), envelope("apply", document))
    assert status == 409
    assert body["restart_required_paths"] == ["admin.listen"] and body["applied"] is False


async def test_a_stale_parent_answers_409(edge):
    active = await ConfigRevision.objects.aget(is_active=True)
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = 5
    assert (await call(handler(edge), envelope("apply", document, parent=active.pk)))[0] == 200
    provider(document, "vllm-local")["capacity"] = 6
    status, body = await call(handler(edge), envelope("apply", document, parent=active.pk))
    assert status == 409 and body["outcome"] == "refused_stale_parent"
    assert edge.snapshot.providers["vllm-local"].capacity == 5


async def test_an_invalid_document_answers_400_with_every_error_by_path(edge):
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = 0
    document["openai"]["long_context_threshold_tokens"] = 0
    status, body = await call(handler(edge), envelope("apply", document))
    assert status == 400 and body["valid"] is False
    assert [e["path"] for e in body["errors"]] == [
        "nodes[0].providers[1].capacity",
        "openai.long_context_threshold_tokens",
    ]


@pytest.mark.parametrize(
    ("body", "query", "content_type", "needle"),
    [
        (b"{not json", "", "application/json", "not valid JSON"),
        (b'{"mode": "apply"}', "", "application/json", '"config"'),
        (b'{"mode": "later", "config": {}}', "", "application/json", "mode must be"),
        (b"edge: {}", "", "application/yaml", "mode must be"),
        (b"edge: [", "mode=dry_run", "application/yaml", "YAML syntax error"),
        (b'{"mode": "apply", "config": {}, "parent": "x"}', "", "application/json", "parent"),
    ],
)
async def test_unreadable_requests_answer_400_saying_why(edge, body, query, content_type, needle):
    status, answer = await call(handler(edge), body, query=query, content_type=content_type)
    assert status == 400
    assert needle in answer["errors"][0]["message"]


async def test_a_body_over_the_limit_answers_413_request_too_large(edge, monkeypatch):
    """The control listener names an oversized body as the API does (docs/http-api.md)."""
    monkeypatch.setattr(endpoint, "MAX_BODY_BYTES", 1024)
    status, body = await call(handler(edge), b"x" * 4096, chunk=512)
    assert status == 413 and body["error"]["code"] == "request_too_large"


async def test_mode_stage_records_a_restart_required_change_for_the_next_start(edge):
    """R-REF-2: a restart-required candidate refused by apply can be staged from the shell."""
    active = await ConfigRevision.objects.aget(is_active=True)
    document = edge.snapshot.document
    document["admin"]["listen"] = "127.0.0.1:7799"
    text = yaml.safe_dump(document).encode()
    status, body = await call(
        handler(edge), text, query="mode=stage", content_type="application/yaml"
    )
    assert status == 200 and body["outcome"] == "staged", body
    assert body["restart_required_paths"] == ["admin.listen"]
    assert (body["parent"], body["active"]) == (active.pk, active.pk)
    staged = await ConfigRevision.objects.aget(pk=body["revision"])
    assert staged.state == ConfigRevision.State.STAGED
    assert edge.snapshot.admin_listen.port == 7701  # nothing applied


async def test_every_report_names_the_active_revision_refusals_included(edge):
    """R-REF-1: an invalid candidate's report still says which revision runs."""
    active = await ConfigRevision.objects.aget(is_active=True)
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = 0
    for mode in ("dry_run", "apply", "stage"):
        status, body = await call(handler(edge), envelope(mode, document))
        assert status == 400 and body["active"] == active.pk, (mode, body)


# --- R-REF-6 -------------------------------------------------------------------------------------


async def test_no_secret_value_reaches_a_report_or_a_log_line(edge, caplog, monkeypatch):
    monkeypatch.setenv("IOP_OPENAI_TOKEN", "sk-live-caller-token-1")
    monkeypatch.setenv("VLLM_KEY", "sk-upstream-key-2")
    caplog.set_level(logging.DEBUG)
    secrets = [
        "sk-live-caller-token-1",
        "sk-upstream-key-2",
        "sk-invalid-literal-3",
        "sk-invalid-header-4",
    ]
    document = edge.snapshot.document
    document["openai"]["bearer_token"] = {"env": "IOP_OPENAI_TOKEN"}
    new_hash = "ab" * 32
    document["openai"]["principal_tokens"][0]["token_hash_sha256"] = new_hash
    provider(document, "vllm-local").update(profile="openai", credential={"env": "VLLM_KEY"})
    bodies = []
    for mode in ("dry_run", "apply"):
        bodies.append((await call(handler(edge), envelope(mode, document)))[1])
    invalid = edge.snapshot.document
    invalid["openai"]["bearer_token"] = "sk-invalid-literal-3"
    provider(invalid, "vllm-local")["headers"] = {"X-Api-Key": "sk-invalid-header-4"}
    bodies.append((await call(handler(edge), envelope("apply", invalid)))[1])
    assert bodies[1]["outcome"] == "refused_restart_required"
    assert [e["path"] for e in bodies[2]["errors"]] == [
        "nodes[0].providers[1].headers.X-Api-Key",
        "openai.bearer_token",
    ]
    rows = [r async for r in ConfigRevision.objects.values("report")]
    text = json.dumps(bodies) + json.dumps(rows) + caplog.text
    for value in (*secrets, new_hash):
        assert value not in text


# --- what a web page could send (R-CTL-1) ---------------------------------------------------------


async def untouched_receive() -> dict:
    raise AssertionError("the body was read")


async def control_call(
    app: Any, headers: list[tuple[bytes, bytes]], query: str
) -> tuple[int, dict]:
    """One POST /refresh whose receive() fails the test if the app reads the body."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/refresh",
        "query_string": query.encode(),
        "headers": headers,
        "client": LOOPBACK,
        "server": ("127.0.0.1", 7701),
    }
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, untouched_receive, send)
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        # a cross-origin fetch/form: Origin, text/plain (no preflight needed)
        (
            [
                (b"host", b"127.0.0.1:7701"),
                (b"origin", b"http://evil.example"),
                (b"content-type", b"text/plain"),
            ],
            403,
            "forbidden",
        ),
        # Origin alone refuses, whatever the Content-Type
        ([(b"origin", b"null"), (b"content-type", b"application/yaml")], 403, "forbidden"),
        # DNS rebinding: the page's own name as Host
        (
            [(b"host", b"evil.example:7701"), (b"content-type", b"application/yaml")],
            403,
            "forbidden",
        ),
        ([(b"host", b"localhost:9999"), (b"content-type", b"application/yaml")], 403, "forbidden"),
        # form bodies, text/plain, or none at all
        ([(b"host", b"localhost:7701"), (b"content-type", b"text/plain")], 415, None),
        (
            [(b"host", b"127.0.0.1"), (b"content-type", b"application/x-www-form-urlencoded")],
            415,
            None,
        ),
        ([(b"content-type", b"multipart/form-data; boundary=x")], 415, None),
        ([(b"host", b"127.0.0.1:7701")], 415, None),
    ],
)
async def test_a_request_a_web_page_could_send_is_refused_before_its_body_and_stages_nothing(
    edge, headers, status, code
):
    """R-CTL-1: an Origin header or a foreign Host is 403, a Content-Type a page can send
    cross-origin without a preflight is 415; the body is never read, no revision is made."""
    answer_status, body = await control_call(ControlApp(edge), headers, "mode=stage")
    assert answer_status == status
    assert body["error"]["code"] == (code or "unsupported_media_type")
    assert await ConfigRevision.objects.acount() == 1
    assert not await ConfigRevision.objects.filter(state=ConfigRevision.State.STAGED).aexists()


@pytest.mark.parametrize(
    "host", [b"127.0.0.1:7701", b"127.0.0.1", b"localhost:7701", b"LOCALHOST", None]
)
@pytest.mark.parametrize(
    "kind", ["application/yaml", "application/x-yaml", "text/yaml; charset=utf-8"]
)
async def test_curl_shaped_requests_pass_the_browser_checks(edge, host, kind):
    """R-CTL-1: the listener's own address or localhost, with its own port or none, and each
    accepted document type (parameters ignored) reach the refresh service."""
    document = yaml.safe_dump(edge.snapshot.document).encode()
    status, body = await call(
        ControlApp(edge),
        document,
        query="mode=dry_run",
        content_type=kind,
        headers=((b"host", host),) if host else (),
    )
    assert status == 200 and body["changed"] is False, body
