"""Managed mode on the HTTP surface, in process: a route key is the caller's credential, it
binds slots before admission, and each run carries an envelope the Node can open
(R-AUTH-5, R-MGD-3, R-MGD-4, R-MGD-5).

A real pool, NodeHub and OpenAIApp; the Node side opens envelopes with its real half
(``nodes.agent.credentials``); slots and routes in the test database.
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db.backends.utils import CursorWrapper

from catalog.config import load_snapshot
from catalog.documents import document_to_catalog
from catalog.keyring import Keyring, new_keyring
from catalog.models import CredentialSlot, Route
from catalog.route_reader import rebuild_route_table, refresh_route_table
from catalog.slots import create_route, set_slot
from edgekit.running import attach_runtime
from nodes import wire
from nodes.agent.adapters.http import slot_headers
from nodes.agent.config import CredentialPlane
from nodes.agent.credentials import LeaseCredentials, load_opener
from pool.http.app import OpenAIApp
from pool.http.managed import ManagedKeys
from tests.support.inprocess import Call, FakeNode, Runtime, answer_ok
from tests.support.managed import managed_document, mint_keys
from tests.support.payloads import chat_body, openai_provider

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = b"sk-surface-canary-93c1f0aa"


class Managed:
    """The Edge side in process and a Node that opens each run's envelope."""

    def __init__(self, directory: Path) -> None:
        self.keys = mint_keys(directory / "keys", "n1")
        self.keyring_file = directory / "keyring.json"
        call_command(
            "iop_keyring", "init", str(self.keyring_file), "--key-id", "k1", stdout=io.StringIO()
        )
        self.document = managed_document(self.keys, self.keyring_file)
        document_to_catalog(self.document)
        set_slot("general", "glm", SECRET, self.keyring())
        set_slot("coding", "glm_coding", b"sk-coding-secret", self.keyring())
        self.key = create_route(
            "team-a", "glm", {"glm-general": "general"}, principal_ref="research"
        )
        self.opened: list[tuple[str, bytes]] = []  # (provider id, secret) per opened run

    def keyring(self) -> Keyring:
        return Keyring.load(self.keyring_file)

    async def start(self) -> None:
        keys = ManagedKeys.load(load_snapshot(self.document))
        await sync_to_async(rebuild_route_table)(keys)
        self.runtime = Runtime(self.document, managed_keys=keys)
        attach_runtime(self.runtime)  # saves in this process rebuild its table (R-MGD-12)
        self.app = OpenAIApp(self.runtime)
        self.node = FakeNode(self.runtime.hub, "n1")
        self.node.script = self._open_and_answer
        await self.node.start()
        plane = CredentialPlane(**self.keys.node_plane())
        self.credentials = LeaseCredentials(load_opener(plane), "n1")

    async def _open_and_answer(self, node: FakeNode, run: Any) -> None:
        provider = openai_provider(
            "http://127.0.0.1:9",
            pid=run.provider_id,
            auth=wire.AuthPayload(type="header", header="X-Key", scheme=""),
        )
        secret = self.credentials.secret(
            run.lease_envelope,
            run_id=run.run_id,
            provider=provider,
            generation=node.session.generation,
        )
        headers = slot_headers(provider, secret)
        self.opened.append((run.provider_id, headers["X-Key"].encode()))
        await answer_ok(node, run)

    def call(self, model: str = "glm", key: str | None = None, **kw: Any) -> Call:
        return Call(
            self.app,
            "POST",
            "/v1/chat/completions",
            chat_body(model=model),
            **kw,
            token=self.key if key is None else key,
        )

    def idle(self) -> bool:
        return self.runtime.pool.idle()


@pytest.fixture
async def edge(tmp_path) -> AsyncIterator[Managed]:
    managed = await sync_to_async(Managed)(tmp_path)
    await managed.start()
    yield managed
    attach_runtime(None)


async def test_a_route_key_calls_its_model_with_the_slot_secret_r_mgd_3_r_mgd_4(edge):
    """R-MGD-3, R-MGD-4: the route's slot secret reaches the Node sealed to it, for this run;
    metering labels come from the route."""
    call = await edge.call().done()
    assert call.status == 200
    assert edge.opened == [("glm-general", SECRET)]
    (run,) = edge.node.runs
    assert run.lease_envelope["slot_id"] == "general"
    assert run.lease_envelope["credential_revision"] == 1
    assert SECRET not in b"".join(edge.node.frames)  # sealed on the wire
    (record,) = edge.runtime.meter.records
    assert (record.principal_ref, record.token_ref) == ("research", "team-a")
    assert edge.idle()


async def test_only_providers_the_route_has_a_slot_for_are_candidates_r_mgd_3(edge):
    """R-MGD-3: glm-general-2 would take the second request by round robin; the route has no
    slot for it, so every request lands on glm-general."""
    for _ in range(3):
        assert (await edge.call().done()).status == 200
    assert [provider for provider, _ in edge.opened] == ["glm-general"] * 3
    assert edge.idle()


async def test_a_changed_slot_is_used_by_the_next_request_without_restart_r_mgd_2(edge):
    """R-MGD-2: the slot is read per request; its credential revision rises."""
    assert (await edge.call().done()).status == 200
    await sync_to_async(set_slot)("general", "glm", b"sk-rotated-secret", edge.keyring())
    assert (await edge.call().done()).status == 200
    assert [secret for _, secret in edge.opened] == [SECRET, b"sk-rotated-secret"]
    assert edge.node.runs[1].lease_envelope["credential_revision"] == 2


async def test_a_keyring_rotated_while_running_is_read_again(edge):
    """R-MGD-2: iop_keyring rotate re-seals under a new key; the running Edge loads it."""
    await sync_to_async(call_command)(
        "iop_keyring", "rotate", "--key-id", "k2", stdout=io.StringIO()
    )
    assert (await edge.call().done()).status == 200
    assert edge.opened == [("glm-general", SECRET)]


async def test_a_route_for_another_model_group_is_refused_before_admission_r_auth_5(edge):
    """R-AUTH-5, R-MGD-9: the route binds its group before admission: another group is
    404 model_not_found, as for a principal token's scope; no lease, no run."""
    call = await edge.call(model="coder").done()
    assert call.status == 404
    assert call.json()["error"]["code"] == "model_not_found"
    assert edge.node.runs == [] and edge.idle()


async def test_a_route_key_sees_only_its_model_group_r_mgd_9(edge):
    """R-MGD-9: /v1/models lists the route's group only; another group's entry is 404."""
    listed = await Call(edge.app, "GET", "/v1/models", b"", token=edge.key).done()
    assert listed.status == 200
    assert [m["id"] for m in listed.json()["data"]] == ["glm"]
    own = await Call(edge.app, "GET", "/v1/models/glm", b"", token=edge.key).done()
    assert own.status == 200 and own.json()["id"] == "glm"
    other = await Call(edge.app, "GET", "/v1/models/coder", b"", token=edge.key).done()
    assert other.status == 404 and other.json()["error"]["code"] == "model_not_found"


async def test_the_context_fit_of_another_group_is_never_revealed_r_mgd_9(edge):
    """R-MGD-9: the route's scope runs before the context-fit check, so a prompt too long
    for another group's window answers model_not_found, never that group's window."""
    provider = edge.document["nodes"][0]["providers"][2]  # glm-coding, group "coder"
    provider["context_window_tokens"] = 64
    await edge.start()
    body = chat_body("word " * 2000, model="coder")
    call = await Call(edge.app, "POST", "/v1/chat/completions", body, token=edge.key).done()
    assert call.status == 404 and call.json()["error"]["code"] == "model_not_found"
    assert "64" not in call.body.decode()
    assert edge.node.runs == []


async def test_an_unknown_route_key_is_refused(edge):
    call = await edge.call(key="iop_route_not-a-real-key").done()
    assert call.status == 401 and call.json()["error"]["code"] == "invalid_api_key"
    assert edge.node.runs == []


async def test_a_caller_supplied_provider_credential_is_refused_per_request_r_mgd_5(edge):
    """R-MGD-5, R-AUTH-3: a legacy provider credential header is refused, not forwarded."""
    call = await edge.call(headers={"X-IOP-Provider-Authorization": "Bearer sk-x"}).done()
    assert call.status == 400
    assert call.json()["error"]["code"] == "provider_credential_refused"
    assert edge.node.runs == [] and edge.idle()


async def test_a_keyring_missing_the_slots_key_fails_the_request_and_releases(edge, caplog):
    """A slot sealed under a key id the keyring file no longer holds: 503, the log names the
    slot and the key id, never a secret; the lease is back."""
    caplog.set_level(logging.INFO)
    await sync_to_async(set_slot)("general", "glm", SECRET, new_keyring("other"))
    call = await edge.call().done()
    assert call.status == 503 and call.json()["error"]["code"] == "credential_unavailable"
    assert "slot 'general' is sealed under key 'other', not in the keyring" in caplog.text
    assert SECRET.decode() not in caplog.text + call.body.decode()
    assert edge.node.runs == [] and edge.idle()


async def test_the_right_keyring_file_put_in_place_heals_without_a_change_or_restart(edge):
    """A rotation run on a copy of the keyring re-seals every slot under a key the Edge's file
    lacks: 503 credential_unavailable. Once the operator puts that copy in place, the next
    poll (``refresh_route_table``, what iop_site.credential_watch runs) reads the file again
    though no route or slot changed, and the route answers 200."""
    copy = edge.keyring_file.with_name("rotated-copy.json")
    copy.write_bytes(edge.keyring_file.read_bytes())
    copy.chmod(0o600)
    await sync_to_async(call_command)(
        "iop_keyring", "rotate", "--keyring", str(copy), "--key-id", "k9", stdout=io.StringIO()
    )
    keys = edge.runtime.managed_keys
    await sync_to_async(refresh_route_table)(keys)
    assert keys.table.missing_key
    assert (await edge.call().done()).json()["error"]["code"] == "credential_unavailable"
    version = keys.table.version
    copy.replace(edge.keyring_file)
    assert await sync_to_async(refresh_route_table)(keys)
    assert keys.table.version == version and not keys.table.missing_key
    assert (await edge.call().done()).status == 200
    assert not await sync_to_async(refresh_route_table)(keys)  # healed: polls are cheap again
    assert edge.opened == [("glm-general", SECRET)] and edge.idle()


async def test_a_node_refusing_the_envelope_answers_503_naming_why_r_mgd_4(edge):
    """R-MGD-4: the Node's refusal reaches the caller as credential_unavailable with the
    reason; the lease is back."""

    async def refuse(node: FakeNode, run: Any) -> None:
        error = wire.RunError("credential_refused", "lease envelope refused: it has expired")
        await node.end(run.run_id, ok=False, error=error)

    edge.node.script = refuse
    call = await edge.call().done()
    assert call.status == 503
    error = call.json()["error"]
    assert error["code"] == "credential_unavailable" and "expired" in error["message"]
    assert edge.idle()


async def test_a_failover_stays_among_the_routes_providers_r_mgd_3_r_health_1(edge):
    """R-MGD-3 with R-HEALTH-1: the route binds glm-general and glm-coding (each to a slot of
    its family); when the first fails before the first byte, the retry goes to the other with
    its own slot's secret, never to glm-general-2, which the route has no slot for."""
    key = await sync_to_async(create_route)(
        "team-b", "glm", {"glm-general": "general", "glm-coding": "coding"}
    )

    async def fail_first(node: FakeNode, run: Any) -> None:
        if len(node.runs) == 1:
            error = wire.RunError(
                "upstream_error", "connection refused", retryable=True, phase=wire.PHASE_CONNECT
            )
            await node.end(run.run_id, ok=False, error=error)
        else:
            await edge._open_and_answer(node, run)

    edge.node.script = fail_first
    call = await edge.call(key=key).done()
    assert call.status == 200
    first, second = (run.provider_id for run in edge.node.runs)
    assert {first, second} == {"glm-general", "glm-coding"}  # never glm-general-2
    secrets = {"glm-general": SECRET, "glm-coding": b"sk-coding-secret"}
    assert edge.opened == [(second, secrets[second])]
    assert edge.idle()


async def test_a_request_reads_no_database_and_no_key_file_r_mgd_12_r_mgd_7(edge, monkeypatch):
    """R-MGD-12: the route and its slots come from the in-memory table (no SQL runs on any
    thread while requests are served); R-MGD-7: with every key file and the keyring moved
    away after start, requests and an apply of an unrelated change still succeed."""
    statements: list[str] = []

    def record(self: Any, sql: str, *args: Any, **kw: Any) -> None:
        statements.append(sql)
        raise AssertionError("SQL on the request path")

    monkeypatch.setattr(CursorWrapper, "execute", record)
    monkeypatch.setattr(CursorWrapper, "executemany", record)
    moved = edge.keys.directory.with_name("moved")
    edge.keys.directory.rename(moved)
    edge.keyring_file.rename(edge.keyring_file.with_name("moved-keyring.json"))
    assert (await edge.call().done()).status == 200
    document = edge.runtime.snapshot.document
    document["provider_pool"]["max_queue"] = 5  # an unrelated live change
    edge.runtime.snapshot = load_snapshot(document)
    for _ in range(2):
        assert (await edge.call().done()).status == 200
    assert statements == []
    assert [provider for provider, _ in edge.opened] == ["glm-general"] * 3


async def test_a_sealed_value_shorter_than_its_nonce_answers_503_naming_the_slot(edge, caplog):
    """A corrupted slot row (sealed value shorter than the nonce) is 503
    credential_unavailable naming the slot, not a 500; the lease is back."""
    slot = await CredentialSlot.objects.aget(key="general")
    slot.sealed = "v1:k1:" + base64.b64encode(b"short").decode()
    await sync_to_async(slot.save)()  # the admin's thread: the table follows at once
    call = await edge.call().done()
    assert call.status == 503
    error = call.json()["error"]
    assert error["code"] == "credential_unavailable" and "'general'" in error["message"]
    assert "slot 'general': the sealed value is malformed" in caplog.text
    assert edge.node.runs == [] and edge.idle()


async def test_a_route_disabled_or_deleted_in_process_stops_its_key_at_once_r_mgd_12(edge):
    """R-MGD-12: a save in the Edge's own process (the admin's) rebuilds the route table on
    commit: the disabled route's key is refused by the very next request, the enabled one
    works again, a deleted one is gone."""
    assert (await edge.call().done()).status == 200
    route = await Route.objects.aget(key="team-a")
    route.enabled = False
    await sync_to_async(route.save)()
    refused = await edge.call().done()
    assert refused.status == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    route.enabled = True
    await sync_to_async(route.save)()
    assert (await edge.call().done()).status == 200
    await sync_to_async(route.delete)()
    assert (await edge.call().done()).status == 401
    assert edge.runtime.managed_keys.table.status()["routes"] == 0
