"""The REST API fuzzed from its own OpenAPI schema (schemathesis), in-process through Django's
WSGI application: as staff no request is a 500 and every documented answer matches its schema;
as a non-staff user every operation is refused with 401/403 (docs/admin.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token

from iop_site.runtime import EdgeRuntime
from tests.support.edge import attached_edge  # noqa: F401 (the edge fixture)
from tests.support.examples import examples

# Bounded: a few examples per operation keeps the whole run to seconds.
FUZZ = settings(
    max_examples=examples(12),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def token_for(username: str, *, staff: bool) -> str:
    user = get_user_model().objects.create_user(username, is_staff=staff, is_superuser=staff)
    return Token.objects.create(user=user).key


@pytest.fixture
def staff_token(edge) -> str:
    return token_for("fuzz-staff", staff=True)


@pytest.fixture
def outsider_token(edge) -> str:
    return token_for("fuzz-outsider", staff=False)


@pytest.fixture(autouse=True)
def wsgi_keeps_the_test_transaction() -> Iterator[None]:
    """Django's WSGI handler closes the database connection around each request, which would
    close the test's transaction on PostgreSQL; the test client turns that off the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def api_schema(staff_token: str) -> Any:
    """The schema as the API serves it to staff, bound to the in-process WSGI app."""
    return schemathesis.openapi.from_wsgi(
        "/api/schema/?format=json",
        get_wsgi_application(),
        headers={"Authorization": f"Token {staff_token}"},
    )


def revisions(edge: EdgeRuntime) -> list[int]:
    """Revisions for the fuzzer to hit besides random ids: the active one, a live draft and a
    restart-required draft (so apply, stage and dry-run reach their real paths)."""
    from refresh import services

    live = edge.snapshot.document
    live["provider_pool"]["max_queue"] = 7
    restart = edge.snapshot.document
    restart["edge"]["id"] = "edge-renamed"
    drafts = [
        services.create_revision(d, source="document", author_label="fuzz") for d in (live, restart)
    ]
    active = services.active_revision()
    assert active is not None and all(o.revision is not None for o in drafts)
    return [active.pk, *(o.revision.pk for o in drafts if o.revision is not None)]


def with_known_ids(strategy: Any, ids: list[int]) -> Any:
    """Generated cases whose ``{id}`` is, half the time, a revision that exists."""

    def pick(pair: tuple[Any, int | None]) -> Any:
        case, known = pair
        if known is not None:
            case.path_parameters = {**(case.path_parameters or {}), "id": known}
        return case

    return st.tuples(strategy, st.one_of(st.none(), st.sampled_from(ids))).map(pick)


def fuzz_every_operation(schema: Any, ids: list[int], check: Callable[[Any], None]) -> list[str]:
    """Run ``check`` on bounded generated cases of every operation; the operations' labels."""
    labels = []
    for result in schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)
        strategy = operation.as_strategy()
        if "{id}" in operation.path:
            strategy = with_known_ids(strategy, ids)

        @FUZZ
        @given(case=strategy)
        def run(case: Any) -> None:
            check(case)

        run()
    return labels


def test_as_staff_no_request_is_a_server_error_and_answers_match_the_schema(edge, staff_token):
    headers = {"Authorization": f"Token {staff_token}"}
    checks = [
        schemathesis.checks.not_a_server_error,
        schemathesis.checks.response_schema_conformance,
        schemathesis.checks.content_type_conformance,
    ]
    labels = fuzz_every_operation(
        api_schema(staff_token),
        revisions(edge),
        lambda case: case.call_and_validate(headers=headers, checks=checks),
    )
    assert "POST /api/revisions/{id}/apply/" in labels and len(labels) >= 9


@pytest.mark.parametrize("who", ["non-staff user", "anonymous"])
def test_everyone_but_staff_is_refused_by_every_operation(edge, staff_token, outsider_token, who):
    headers = {"Authorization": f"Token {outsider_token}"} if who == "non-staff user" else {}

    def refused(case: Any) -> None:
        response = case.call(headers=headers)
        assert response.status_code in (401, 403), (case.method, case.path, response.text)

    fuzz_every_operation(api_schema(staff_token), revisions(edge), refused)
