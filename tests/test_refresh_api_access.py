"""Who may use the REST API under /api/: staff with the admin's model permissions, no one else."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from iop_site.runtime import EdgeRuntime
from refresh.models import ConfigRevision
from tests.support.edge import attached_edge, capacity_edit  # noqa: F401 (the edge fixture)


def caller(username: str, *codenames: str, staff: bool = True) -> APIClient:
    user = get_user_model().objects.create_user(username, is_staff=staff)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = APIClient()
    client.force_authenticate(user)
    return client


def draft(edge: EdgeRuntime) -> ConfigRevision:
    from refresh import services

    outcome = services.create_revision(capacity_edit(edge, 5), source="document", author_label="t")
    assert outcome.revision is not None
    return outcome.revision


def test_staff_without_a_revision_permission_can_neither_read_nor_change(edge):
    api = caller("staff-only")
    revision = draft(edge)
    assert api.get("/api/revisions/").status_code == 403
    assert api.get(f"/api/revisions/{revision.pk}/").status_code == 403
    assert api.get(f"/api/revisions/{revision.pk}/diff/").status_code == 403
    assert api.post(f"/api/revisions/{revision.pk}/dry-run/").status_code == 403
    assert api.post("/api/revisions/", {"from_catalog": True}, format="json").status_code == 403
    assert api.post(f"/api/revisions/{revision.pk}/apply/").status_code == 403
    assert not ConfigRevision.objects.get(pk=revision.pk).is_active


def test_staff_with_view_reads_and_dry_runs_but_cannot_create_apply_or_stage(edge):
    api = caller("viewer", "view_configrevision")
    revision = draft(edge)
    count = ConfigRevision.objects.count()
    assert api.get("/api/revisions/").status_code == 200
    assert api.get(f"/api/revisions/{revision.pk}/").status_code == 200
    assert api.get(f"/api/revisions/{revision.pk}/diff/").status_code == 200
    assert api.post(f"/api/revisions/{revision.pk}/dry-run/").status_code == 200
    assert api.post("/api/revisions/", {"from_catalog": True}, format="json").status_code == 403
    assert api.post("/api/revisions/from-catalog/").status_code == 403
    assert api.post(f"/api/revisions/{revision.pk}/apply/").status_code == 403
    assert api.post(f"/api/revisions/{revision.pk}/stage/").status_code == 403
    assert ConfigRevision.objects.count() == count
    assert ConfigRevision.objects.get(pk=revision.pk).state == ConfigRevision.State.DRAFT


def test_staff_with_add_creates_but_needs_change_to_apply(edge):
    api = caller("author", "add_configrevision", "view_configrevision")
    created = api.post("/api/revisions/", {"document": capacity_edit(edge, 5)}, format="json")
    assert created.status_code == 201
    revision_id = created.json()["id"]
    assert api.post(f"/api/revisions/{revision_id}/apply/").status_code == 403
    assert edge.snapshot.providers["vllm-local"].capacity != 5


def test_staff_with_change_applies_and_stages_as_in_the_admin(edge):
    api = caller("operator", "change_configrevision")
    revision = draft(edge)
    assert api.get("/api/revisions/").status_code == 200  # change implies view, as in the admin
    response = api.post(f"/api/revisions/{revision.pk}/apply/")
    assert response.status_code == 200 and response.json()["applied"] is True
    assert edge.snapshot.providers["vllm-local"].capacity == 5
    document = edge.snapshot.document
    document["edge"]["id"] = "edge-renamed"
    from refresh import services

    restart = services.create_revision(document, source="document", author_label="t").revision
    assert restart is not None
    assert api.post(f"/api/revisions/{restart.pk}/stage/").status_code == 200


def test_a_non_staff_user_with_every_permission_is_refused_everywhere(edge):
    api = caller(
        "outsider",
        "view_configrevision",
        "add_configrevision",
        "change_configrevision",
        staff=False,
    )
    revision = draft(edge)
    assert api.get("/api/").status_code == 403
    assert api.get("/api/revisions/").status_code == 403
    assert api.get(f"/api/revisions/{revision.pk}/").status_code == 403
    assert api.post("/api/revisions/", {"from_catalog": True}, format="json").status_code == 403
    assert api.post(f"/api/revisions/{revision.pk}/apply/").status_code == 403
    assert api.get("/api/schema/").status_code == 403
    assert api.get("/api/pool/").status_code == 403


def test_the_openapi_schema_is_for_staff_only(db):
    assert APIClient().get("/api/schema/").status_code in (401, 403)
    assert caller("someone", staff=False).get("/api/schema/").status_code == 403
    response = caller("staff-reader").get("/api/schema/", {"format": "json"})
    assert response.status_code == 200 and "/api/revisions/" in response.json()["paths"]
