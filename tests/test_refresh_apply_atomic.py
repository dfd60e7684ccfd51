"""Apply is atomic between the database and the running Edge: the rows are committed first,
then the Edge swaps; a failed swap leaves the Edge on the old revision, puts the old revision
back as the active one and marks the new one failed (R-REF-3, docs/refresh.md)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from rest_framework.test import APIClient

from catalog.models import Provider
from iop_site.runtime import EdgeRuntime
from refresh import services
from refresh.models import ConfigRevision
from tests.support.edge import attached_edge, capacity_edit  # noqa: F401 (the edge fixture)

State = ConfigRevision.State


def pool_capacity(edge: EdgeRuntime) -> int:
    rows = {row.provider_id: row for row in edge.pool.snapshot().providers}
    return rows["vllm-local"].capacity


@pytest.fixture
def failing_swap(edge: EdgeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool refuses the new policy: the swap itself fails, inside the running Edge."""

    def refuse(policy: Any) -> None:
        raise RuntimeError("injected swap failure")

    monkeypatch.setattr(edge.pool, "apply", refuse)


def test_a_failed_swap_keeps_the_old_revision_running_and_marks_the_new_one_failed(
    edge, failing_swap
):
    before = services.active_revision()
    snapshot = edge.snapshot
    outcome = services.apply_document(
        edge, capacity_edit(edge, 7), source="document", author_label="test"
    )
    assert outcome.status == 500
    assert outcome.body["outcome"] == "failed" and outcome.body["applied"] is False
    assert outcome.body["errors"] == [
        {
            "path": "<root>",
            "message": f"the running Edge could not install revision {outcome.revision.pk}; "
            f"it keeps running revision {before.pk}",
        }
    ]
    assert edge.snapshot is snapshot and pool_capacity(edge) == 4
    failed = ConfigRevision.objects.get(pk=outcome.revision.pk)
    assert failed.state == State.FAILED and not failed.is_active and failed.applied_at is None
    assert services.active_revision() == before
    assert ConfigRevision.objects.filter(is_active=True).count() == 1
    assert Provider.objects.get(key="vllm-local").capacity == 4  # the catalog shows what runs


def test_a_failed_swap_through_the_rest_api_answers_500_with_the_report(edge, failing_swap):
    from django.contrib.auth import get_user_model

    api = APIClient()
    api.force_authenticate(
        get_user_model().objects.create_user("ops", is_staff=True, is_superuser=True)
    )
    created = api.post("/api/revisions/", {"document": capacity_edit(edge, 7)}, format="json")
    response = api.post(f"/api/revisions/{created.json()['id']}/apply/")
    assert response.status_code == 500
    assert response.json()["outcome"] == "failed"
    assert api.get(f"/api/revisions/{created.json()['id']}/").json()["state"] == "failed"
    # The next change is built on the revision that still runs, and applies.
    again = api.post("/api/revisions/", {"document": capacity_edit(edge, 6)}, format="json")
    assert again.json()["parent"] == services.active_revision().pk


def test_after_a_failed_swap_the_next_apply_succeeds(edge, monkeypatch, failing_swap):
    services.apply_document(edge, capacity_edit(edge, 7), source="document", author_label="t")
    monkeypatch.undo()
    outcome = services.apply_document(
        edge, capacity_edit(edge, 6), source="document", author_label="t"
    )
    assert outcome.status == 200 and pool_capacity(edge) == 6
    assert services.active_revision() == outcome.revision


def test_the_rows_are_committed_before_the_running_edge_swaps(transactional_db, monkeypatch):
    """Another connection already sees the new revision active while the swap runs."""
    from refresh.startup import startup_snapshot
    from tests.support.edge import EDGE_YAML

    edge = EdgeRuntime(startup_snapshot(str(EDGE_YAML)))
    seen: list[int] = []
    real_apply = edge.apply

    def active_elsewhere() -> int:
        try:
            return ConfigRevision.objects.get(is_active=True).pk
        finally:
            connection.close()  # this thread's own connection

    async def observing(snapshot: Any, *, revision: int | None = None) -> Any:
        seen.append(await sync_to_async(active_elsewhere, thread_sensitive=False)())
        return await real_apply(snapshot, revision=revision)

    monkeypatch.setattr(edge, "apply", observing)
    outcome = services.apply_document(
        edge, capacity_edit(edge, 5), source="document", author_label="t"
    )
    assert outcome.status == 200 and seen == [outcome.revision.pk]


def test_a_refused_candidate_leaves_no_draft_behind_when_it_is_stale(edge):
    count = ConfigRevision.objects.count()
    outcome = services.apply_document(
        edge, capacity_edit(edge, 5), source="document", author_label="t", parent=999
    )
    assert outcome.status == 409 and ConfigRevision.objects.count() == count
