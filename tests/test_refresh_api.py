"""The REST API under /api/ (staff only) and the admin pages for config revisions."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from edgekit.running import attach_runtime
from iop_site.runtime import EdgeRuntime
from refresh.models import ConfigRevision
from refresh.startup import startup_snapshot
from tests.support.config import provider
from tests.support.processes import EDGE_YAML

State = ConfigRevision.State


@pytest.fixture
def staff(db):
    return get_user_model().objects.create_user("ops", is_staff=True, is_superuser=True)


@pytest.fixture
def api(staff) -> APIClient:
    client = APIClient()
    client.force_authenticate(staff)
    return client


@pytest.fixture
def edge(db):
    """A running Edge in this process, as the API and the admin find it."""
    runtime = EdgeRuntime(startup_snapshot(str(EDGE_YAML)))
    attach_runtime(runtime)
    yield runtime
    attach_runtime(None)


def create(api: APIClient, document: dict) -> dict:
    response = api.post("/api/revisions/", {"document": document}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def capacity_edit(edge: EdgeRuntime, capacity: int) -> dict:
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = capacity
    return document


# --- access --------------------------------------------------------------------------------------


def test_anonymous_and_non_staff_callers_are_refused(db):
    assert APIClient().get("/api/revisions/").status_code in (401, 403)
    user = get_user_model().objects.create_user("someone")
    client = APIClient()
    client.force_authenticate(user)
    assert client.get("/api/revisions/").status_code == 403
    assert client.post("/api/revisions/", {"from_catalog": True}, format="json").status_code == 403


def test_a_staff_token_authenticates(edge, staff):
    token = Token.objects.create(user=staff)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    assert client.get("/api/revisions/").status_code == 200


# --- revisions -----------------------------------------------------------------------------------


def test_list_is_newest_first_without_documents_and_retrieve_has_the_document(api, edge):
    created = create(api, capacity_edit(edge, 5))
    listing = api.get("/api/revisions/").json()
    assert [row["id"] for row in listing] == sorted((row["id"] for row in listing), reverse=True)
    assert "document" not in listing[0]
    detail = api.get(f"/api/revisions/{created['id']}/").json()
    assert provider(detail["document"], "vllm-local")["capacity"] == 5
    assert detail["state"] == State.DRAFT and detail["author_label"] == "ops"
    assert detail["parent"] == ConfigRevision.objects.get(is_active=True).pk


def test_create_from_an_invalid_document_answers_400_with_paths_and_stores_nothing(api, edge):
    count = ConfigRevision.objects.count()
    response = api.post("/api/revisions/", {"document": capacity_edit(edge, 0)}, format="json")
    assert response.status_code == 400
    assert [e["path"] for e in response.json()["errors"]] == ["nodes[0].providers[1].capacity"]
    assert ConfigRevision.objects.count() == count


@pytest.mark.parametrize(
    "payload", [{}, {"document": {"edge": {}}, "from_catalog": True}, {"document": [1, 2]}]
)
def test_create_needs_exactly_one_document_source(api, edge, payload):
    assert api.post("/api/revisions/", payload, format="json").status_code == 400


def test_create_from_the_catalog(api, edge):
    for response in (
        api.post("/api/revisions/", {"from_catalog": True}, format="json"),
        api.post("/api/revisions/from-catalog/"),
    ):
        assert response.status_code == 201
        assert response.json()["source"] == "catalog"
        assert response.json()["report"]["changed"] is False


def test_diff_against_parent_active_or_any_revision(api, edge):
    first = create(api, capacity_edit(edge, 5))
    base = "/api/revisions/{}/diff/"
    path = 'nodes["node-local"].providers["vllm-local"].capacity'
    assert api.get(base.format(first["id"])).json()["live_paths"] == [path]
    assert api.get(base.format(first["id"]) + "?against=active").json()["live_paths"] == [path]
    same = api.get(base.format(first["id"]) + f"?against={first['id']}").json()
    assert same["changed"] is False and same["live_paths"] == []
    assert api.get(base.format(first["id"]) + "?against=nonsense").status_code == 400


def test_dry_run_reports_and_changes_nothing(api, edge):
    created = create(api, capacity_edit(edge, 5))
    before = list(ConfigRevision.objects.values())
    snapshot = edge.snapshot
    response = api.post(f"/api/revisions/{created['id']}/dry-run/")
    assert response.status_code == 200
    assert response.json()["mode"] == "dry_run" and response.json()["revision"] == created["id"]
    assert list(ConfigRevision.objects.values()) == before and edge.snapshot is snapshot


def test_apply_live_then_refuse_restart_required_then_stage(api, edge):
    created = create(api, capacity_edit(edge, 5))
    response = api.post(f"/api/revisions/{created['id']}/apply/")
    assert response.status_code == 200 and response.json()["applied"] is True
    assert edge.snapshot.providers["vllm-local"].capacity == 5
    assert ConfigRevision.objects.get(is_active=True).applied_by == "ops"

    document = edge.snapshot.document
    document["edge"]["id"] = "edge-renamed"
    restart = create(api, document)
    response = api.post(f"/api/revisions/{restart['id']}/apply/")
    assert response.status_code == 409
    assert response.json()["restart_required_paths"] == ["edge.id"]
    response = api.post(f"/api/revisions/{restart['id']}/stage/")
    assert response.status_code == 200
    assert ConfigRevision.objects.get(pk=restart["id"]).state == State.STAGED


def test_apply_without_a_running_edge_answers_503(api, edge):
    created = create(api, capacity_edit(edge, 5))
    attach_runtime(None)
    assert api.post(f"/api/revisions/{created['id']}/apply/").status_code == 503


def test_the_openapi_schema_describes_every_revision_operation(api, db):
    response = api.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    for path in (
        "/api/revisions/",
        "/api/revisions/{id}/",
        "/api/revisions/{id}/diff/",
        "/api/revisions/{id}/dry-run/",
        "/api/revisions/{id}/apply/",
        "/api/revisions/{id}/stage/",
        "/api/revisions/from-catalog/",
    ):
        assert path in paths, path
    apply_responses = paths["/api/revisions/{id}/apply/"]["post"]["responses"]
    assert {"200", "409"} <= set(apply_responses)


# --- admin ---------------------------------------------------------------------------------------


@pytest.fixture
def browser(client, staff):
    client.force_login(staff)
    return client


def test_admin_history_lists_who_and_when(browser, edge):
    response = browser.get(reverse("admin:refresh_configrevision_changelist"))
    assert response.status_code == 200
    text = response.content.decode()
    assert "Create revision from catalog" in text
    assert "runedge --config" in text


def test_admin_creates_from_catalog_and_shows_the_dry_run_table(browser, edge):
    from catalog.models import Provider

    Provider.objects.filter(key="vllm-local").update(capacity=6)
    response = browser.post(reverse("admin:refresh_from_catalog"))
    revision = ConfigRevision.objects.first()
    assert revision.source == "catalog" and revision.author_label == "ops"
    assert response.url == reverse("admin:refresh_dry_run", args=[revision.pk])
    page = browser.get(response.url).content.decode()
    assert "nodes[&quot;node-local&quot;].providers[&quot;vllm-local&quot;].capacity" in page
    assert "Apply live" in page


def test_admin_apply_and_stage_buttons(browser, edge):
    document = edge.snapshot.document
    provider(document, "vllm-local")["capacity"] = 7
    from refresh import services

    revision = services.create_revision(document, source="document", author_label="t").revision
    assert browser.get(reverse("admin:refresh_apply", args=[revision.pk])).status_code == 405
    browser.post(reverse("admin:refresh_apply", args=[revision.pk]))
    revision.refresh_from_db()
    assert revision.is_active and edge.snapshot.providers["vllm-local"].capacity == 7
    page = browser.get(reverse("admin:refresh_configrevision_change", args=[revision.pk]))
    assert "live" in page.content.decode() and page.status_code == 200


def test_admin_apply_action_refuses_restart_required_with_the_paths(browser, edge):
    from refresh import services

    document = edge.snapshot.document
    document["admin"]["listen"] = "127.0.0.1:7798"
    revision = services.create_revision(document, source="document", author_label="t").revision
    response = browser.post(
        reverse("admin:refresh_configrevision_changelist"),
        {"action": "apply_selected", "_selected_action": [revision.pk]},
        follow=True,
    )
    assert "admin.listen: restart required" in response.content.decode()
    revision.refresh_from_db()
    assert revision.state == State.REFUSED and not revision.is_active


def test_admin_cannot_add_or_delete_revisions(browser, edge):
    assert browser.get(reverse("admin:refresh_configrevision_add")).status_code == 403
    active = ConfigRevision.objects.get(is_active=True)
    url = reverse("admin:refresh_configrevision_delete", args=[active.pk])
    assert browser.get(url).status_code == 403


def test_admin_pages_need_the_model_permissions(client, edge):
    user = get_user_model().objects.create_user("viewer", is_staff=True)
    client.force_login(user)
    active = ConfigRevision.objects.get(is_active=True)
    assert client.get(reverse("admin:refresh_dry_run", args=[active.pk])).status_code == 403
    assert client.post(reverse("admin:refresh_from_catalog")).status_code == 403
    assert client.post(reverse("admin:refresh_apply", args=[active.pk])).status_code == 403
    assert ConfigRevision.objects.count() == 1
