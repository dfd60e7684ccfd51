"""Revisions, dry-run, apply, stage and startup against a real EdgeRuntime (R-REF-1..5)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from django.db import IntegrityError, transaction

from catalog.config import ConfigError, load_file
from catalog.documents import document_to_catalog
from iop_site.runtime import EdgeRuntime
from refresh import services
from refresh.models import ConfigRevision
from refresh.startup import startup_snapshot
from tests.support.config import Doc, provider
from tests.support.processes import EDGE_YAML

State = ConfigRevision.State


def model(doc: Doc, model_id: str) -> Doc:
    return next(m for m in doc["models"] if m["id"] == model_id)


@pytest.fixture
def edge(db) -> EdgeRuntime:
    """An Edge started the way runedge starts it: from the config file as the active revision."""
    return EdgeRuntime(startup_snapshot(str(EDGE_YAML)))


@pytest.fixture
def operator(db):
    """A superuser without a password (no slow hashing in tests)."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("operator", is_staff=True, is_superuser=True)


def edited(runtime: EdgeRuntime, edit: Callable[[Doc], object]) -> Doc:
    document = runtime.snapshot.document
    edit(document)
    return document


def apply(runtime: EdgeRuntime, document: Doc, parent: int | None = None) -> services.Outcome:
    return services.apply_document(
        runtime, document, source="document", author_label="test", parent=parent
    )


# --- dry-run -------------------------------------------------------------------------------------


def test_dry_run_leaves_the_active_snapshot_and_the_database_byte_identical(edge):
    before_snapshot, before_json = edge.snapshot, edge.snapshot.document_json
    before_pool = edge.pool.snapshot().as_dict()
    before_rows = list(ConfigRevision.objects.values())
    candidate = edited(edge, lambda d: provider(d, "vllm-local").update(capacity=9))
    candidate["edge"]["listen"] = "127.0.0.1:7719"
    outcome = services.dry_run(candidate, edge)
    assert outcome.status == 200
    assert outcome.body["live_paths"] == ['nodes["node-local"].providers["vllm-local"].capacity']
    assert outcome.body["restart_required_paths"] == ["edge.listen"]
    assert outcome.body["applied"] is False
    assert edge.snapshot is before_snapshot
    assert edge.snapshot.document_json == before_json
    assert edge.pool.snapshot().as_dict() == before_pool
    assert list(ConfigRevision.objects.values()) == before_rows


def test_an_invalid_candidate_is_refused_with_every_error_by_path_and_nothing_recorded(edge):
    candidate = edited(edge, lambda d: provider(d, "vllm-local").update(capacity=0))
    candidate["openai"]["long_context_threshold_tokens"] = -1
    count = ConfigRevision.objects.count()
    for outcome in (services.dry_run(candidate, edge), apply(edge, candidate)):
        assert outcome.status == 400
        paths = [e["path"] for e in outcome.body["errors"]]
        assert "nodes[0].providers[1].capacity" in paths
        assert "openai.long_context_threshold_tokens" in paths
    assert ConfigRevision.objects.count() == count
    assert provider(edge.snapshot.document, "vllm-local")["capacity"] == 4


# --- apply ---------------------------------------------------------------------------------------

LIVE_EDITS = [
    (
        "capacity",
        lambda d: provider(d, "vllm-local").update(capacity=7),
        lambda s: s.providers["vllm-local"].capacity == 7,
    ),
    (
        "long_context_capacity",
        lambda d: provider(d, "vllm-local").update(long_context_capacity=2),
        lambda s: s.providers["vllm-local"].long_context_capacity == 2,
    ),
    (
        "priority",
        lambda d: provider(d, "ollama-local").update(priority=1),
        lambda s: s.providers["ollama-local"].priority == 1,
    ),
    (
        "enabled",
        lambda d: provider(d, "echo-cli").update(enabled=False),
        lambda s: s.providers["echo-cli"].enabled is False,
    ),
    ("max_queue", lambda d: d["provider_pool"].update(max_queue=3), lambda s: s.max_queue == 3),
    (
        "queue_timeout_ms",
        lambda d: d["provider_pool"].update(queue_timeout_ms=0),
        lambda s: s.queue_timeout_ms == 0,
    ),
    (
        "usage_attribution",
        lambda d: model(d, "qwen-local").update(usage_attribution="model_group"),
        lambda s: s.models["qwen-local"].usage_attribution == "model_group",
    ),
    (
        "model_mapping",
        lambda d: model(d, "echo")["providers"].update({"echo-cli": "echo-v2"}),
        lambda s: s.models["echo"].providers["echo-cli"] == "echo-v2",
    ),
    (
        "model_added",
        lambda d: d["models"].append({"id": "echo-2", "providers": {"echo-cli": "echo"}}),
        lambda s: "echo-2" in s.models,
    ),
    (
        "threshold",
        lambda d: d["openai"].update(long_context_threshold_tokens=5000),
        lambda s: s.long_context_threshold_tokens == 5000,
    ),
]


@pytest.mark.parametrize(
    ("edit", "check"), [e[1:] for e in LIVE_EDITS], ids=[e[0] for e in LIVE_EDITS]
)
def test_each_live_edit_applies_without_restart_and_becomes_the_active_revision(edge, edit, check):
    old_active = services.active_revision()
    outcome = apply(edge, edited(edge, edit))
    assert outcome.status == 200, outcome.body
    assert outcome.body["applied"] is True and outcome.body["restart_required_paths"] == []
    assert check(edge.snapshot)
    revision = services.active_revision()
    assert revision == outcome.revision and revision.parent == old_active
    assert revision.state == State.APPLIED and revision.applied_at is not None
    assert revision.report == outcome.body
    assert ConfigRevision.objects.filter(is_active=True).count() == 1


def test_a_live_capacity_edit_reaches_the_pool(edge):
    apply(edge, edited(edge, lambda d: provider(d, "vllm-local").update(capacity=7)))
    rows = {row.provider_id: row for row in edge.pool.snapshot().providers}
    assert rows["vllm-local"].capacity == 7


def test_an_applied_document_becomes_the_catalog(edge):
    from catalog.documents import catalog_to_document
    from catalog.models import Provider

    outcome = apply(edge, edited(edge, lambda d: provider(d, "vllm-local").update(capacity=9)))
    assert outcome.status == 200
    assert Provider.objects.get(key="vllm-local").capacity == 9
    assert catalog_to_document() == edge.snapshot.document


def test_any_restart_required_path_refuses_the_whole_candidate_with_409(edge):
    before = edge.snapshot
    candidate = edited(edge, lambda d: provider(d, "vllm-local").update(capacity=7))
    candidate["edge"]["listen"] = "127.0.0.1:7719"
    outcome = apply(edge, candidate)
    assert outcome.status == 409
    body = outcome.body
    assert body["outcome"] == "refused_restart_required" and body["applied"] is False
    assert body["restart_required_paths"] == ["edge.listen"]
    assert body["live_paths"] == ['nodes["node-local"].providers["vllm-local"].capacity']
    assert edge.snapshot is before  # nothing half-applied, not even the live part
    assert outcome.revision.state == State.REFUSED and not outcome.revision.is_active


def test_a_no_change_apply_swaps_the_snapshot_and_records_the_revision(edge):
    before = edge.snapshot
    outcome = apply(edge, edge.snapshot.document)
    assert outcome.status == 200
    assert outcome.body["changed"] is False and outcome.body["pushed_nodes"] == []
    assert edge.snapshot is not before and edge.snapshot == before
    assert services.active_revision() == outcome.revision


def test_a_revision_built_on_a_parent_that_is_no_longer_active_is_refused(edge, operator):
    first = services.create_revision(
        edited(edge, lambda d: provider(d, "vllm-local").update(capacity=5)),
        source="document",
        author=operator,
    ).revision
    second = services.create_revision(
        edited(edge, lambda d: provider(d, "vllm-local").update(capacity=6)),
        source="document",
        author=operator,
    ).revision
    assert first.parent_id == second.parent_id
    assert services.apply_revision(edge, first, actor=operator).status == 200
    outcome = services.apply_revision(edge, second, actor=operator)
    assert outcome.status == 409
    assert outcome.body["outcome"] == "refused_stale_parent"
    [error] = outcome.body["errors"]
    assert f"built on revision {second.parent_id}" in error["message"]
    assert f"active revision is {first.pk}" in error["message"]
    assert edge.snapshot.providers["vllm-local"].capacity == 5


def test_a_document_with_an_explicit_stale_parent_is_refused(edge):
    stale = services.active_revision().pk
    apply(edge, edited(edge, lambda d: provider(d, "vllm-local").update(capacity=5)))
    outcome = apply(
        edge, edited(edge, lambda d: provider(d, "vllm-local").update(capacity=6)), parent=stale
    )
    assert outcome.status == 409 and outcome.body["outcome"] == "refused_stale_parent"
    assert edge.snapshot.providers["vllm-local"].capacity == 5


def test_applying_without_a_running_edge_answers_503(edge, operator):
    revision = services.create_revision(
        edge.snapshot.document, source="document", author=operator
    ).revision
    outcome = services.apply_revision(None, revision, actor=operator)
    assert outcome.status == 503 and outcome.body["applied"] is False


def test_exactly_one_revision_can_be_active(edge):
    active = services.active_revision()
    with pytest.raises(IntegrityError), transaction.atomic():
        ConfigRevision.objects.create(
            document=active.document,
            digest=active.digest,
            source="document",
            author_label="x",
            is_active=True,
        )


# --- stage and startup ---------------------------------------------------------------------------


def test_a_staged_restart_required_revision_becomes_active_at_the_next_start(edge, operator):
    candidate = edited(edge, lambda d: d["edge"].update(listen="127.0.0.1:7719"))
    revision = services.create_revision(candidate, source="document", author=operator).revision
    assert services.apply_revision(edge, revision, actor=operator).status == 409
    outcome = services.stage_revision(revision, actor=operator)
    assert outcome.status == 200 and outcome.body["restart_required_paths"] == ["edge.listen"]
    revision.refresh_from_db()
    assert revision.state == State.STAGED and not revision.is_active
    snapshot = startup_snapshot(None)
    assert str(snapshot.edge_listen) == "127.0.0.1:7719"
    revision.refresh_from_db()
    assert revision.is_active and revision.state == State.APPLIED


def test_a_staged_revision_overtaken_by_a_live_apply_is_not_activated(edge, operator):
    staged = services.create_revision(
        edited(edge, lambda d: d["edge"].update(listen="127.0.0.1:7719")),
        source="document",
        author=operator,
    ).revision
    services.stage_revision(staged, actor=operator)
    applied = apply(edge, edited(edge, lambda d: provider(d, "vllm-local").update(capacity=5)))
    snapshot = startup_snapshot(None)
    assert str(snapshot.edge_listen) == "127.0.0.1:7700"
    assert services.active_revision() == applied.revision
    staged.refresh_from_db()
    assert staged.state == State.REFUSED
    assert staged.report["outcome"] == "refused_stale_parent"


def test_startup_with_the_same_file_keeps_the_active_revision(edge):
    active = services.active_revision()
    startup_snapshot(str(EDGE_YAML))
    assert services.active_revision() == active
    assert ConfigRevision.objects.count() == 1


def test_startup_with_a_changed_file_makes_it_the_active_revision(edge, tmp_path):
    old = services.active_revision()
    document = load_file(EDGE_YAML).document
    document["edge"]["listen"] = "127.0.0.1:7719"
    path = tmp_path / "edge.yaml"
    path.write_text(yaml.safe_dump(document))
    snapshot = startup_snapshot(str(path))
    assert str(snapshot.edge_listen) == "127.0.0.1:7719"
    new = services.active_revision()
    assert new.parent == old and new.source == "config_file"
    assert new.report["restart_required_paths"] == ["edge.listen"]


def test_startup_with_an_invalid_file_fails_with_path_named_errors_and_keeps_the_active(
    edge, tmp_path
):
    active = services.active_revision()
    document = load_file(EDGE_YAML).document
    provider(document, "vllm-local")["capacity"] = 0
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as caught:
        startup_snapshot(str(path))
    assert [i.path for i in caught.value.issues] == ["nodes[0].providers[1].capacity"]
    assert services.active_revision() == active


def test_startup_with_nothing_active_and_no_file_imports_the_catalog(db, settings):
    settings.IOP_CONFIG_FILE = ""
    document = load_file(EDGE_YAML).document
    provider(document, "vllm-local")["capacity"] = 3
    document_to_catalog(document)
    snapshot = startup_snapshot(None)
    assert snapshot.providers["vllm-local"].capacity == 3
    active = services.active_revision()
    assert active.source == "catalog" and active.digest == snapshot.digest


def test_startup_with_an_empty_catalog_uses_the_configured_file_and_seeds_the_catalog(db, settings):
    from catalog.config import load_snapshot
    from catalog.documents import catalog_to_document

    settings.IOP_CONFIG_FILE = str(EDGE_YAML)
    snapshot = startup_snapshot(None)
    assert snapshot.digest == load_file(EDGE_YAML).digest
    assert load_snapshot(catalog_to_document()).digest == snapshot.digest


def test_create_from_catalog_records_a_draft_with_the_active_parent(edge, operator):
    outcome = services.create_from_catalog(operator)
    revision = outcome.revision
    assert outcome.status == 200 and revision.state == State.DRAFT
    assert revision.parent == services.active_revision()
    assert revision.author == operator and revision.author_label == operator.username
    assert revision.report["changed"] is False  # the catalog was seeded from what runs


def test_a_draft_whose_report_cannot_be_stored_leaves_no_row(edge, monkeypatch):
    """No orphan draft: the row and its report are written in one transaction."""
    count = ConfigRevision.objects.count()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise IntegrityError("report write failed")

    monkeypatch.setattr(services, "_save", broken)
    document = edited(edge, lambda d: provider(d, "vllm-local").update(capacity=5))
    with pytest.raises(IntegrityError):
        services.create_revision(document, source="document", author_label="t")
    assert ConfigRevision.objects.count() == count


def test_documents_are_stored_in_canonical_form(edge):
    raw = copy.deepcopy(edge.snapshot.document)
    del provider(raw, "vllm-local")["first_byte_timeout_ms"]  # a default the loader fills in
    revision = services.create_revision(raw, source="document", author_label="t").revision
    assert provider(revision.document, "vllm-local")["first_byte_timeout_ms"] == 60000
    assert revision.report["changed"] is False


def test_runedge_with_an_invalid_config_fails_naming_each_path(edge, tmp_path):
    from io import StringIO

    from django.core.management import CommandError, call_command

    from iop_site.management.commands.runedge import Command

    document = load_file(EDGE_YAML).document
    provider(document, "vllm-local")["capacity"] = 0
    document["openai"]["long_context_threshold_tokens"] = 0
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(document))
    err = StringIO()
    with pytest.raises(CommandError, match="2 error"):
        call_command(Command(), "--config", str(path), stderr=err)
    lines = err.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "nodes[0].providers[1].capacity",
        "openai.long_context_threshold_tokens",
    ]
    assert services.active_revision().digest == edge.snapshot.digest
