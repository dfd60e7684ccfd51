"""``principals:`` at load (R-MGD-13): what loads, how it round-trips, and every refusal with
the path it names."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.config import load_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import example_document

DAY = {"tokens": 1000, "period": "day"}


def with_principals(*principals: dict[str, Any], tokens: list[dict[str, Any]] = ()) -> Any:  # type: ignore[assignment]
    document = example_document()
    document["principals"] = list(principals)
    document["openai"]["principal_tokens"] = [
        {"token_ref": f"app-{i}", "token_hash_sha256": f"{i:x}" * 64, "principal_ref": "team", **t}
        for i, t in enumerate(tokens, start=10)
    ]
    return document


def test_a_principal_loads_with_its_policy_and_stays_in_the_document_r_mgd_13() -> None:
    """R-MGD-13: every key of an entry reaches the snapshot; the canonical document keeps
    the list as written, so export and import round-trip it."""
    entry = {"id": "team", "budget": DAY, "rpm": 60, "tpm": 9000, "max_in_flight": 4,
             "max_queued": 2}  # fmt: skip
    snapshot = load_snapshot(with_principals(entry, tokens=[{"budget": DAY}, {}]))
    spec = snapshot.principals["team"]
    assert (spec.budget.tokens, spec.budget.period) == (1000, "day")  # type: ignore[union-attr]
    assert (spec.rpm, spec.tpm, spec.max_in_flight, spec.max_queued) == (60, 9000, 4, 2)
    assert snapshot.document["principals"] == [entry]
    assert load_snapshot(snapshot.document) == snapshot
    assert load_snapshot(example_document()).principals == {}


@pytest.mark.parametrize(
    ("entry", "issue"),
    [
        ({"id": "team", "rpm": 0}, "principals[0].rpm: "),
        ({"id": "team", "tpm": -1}, "principals[0].tpm: "),
        ({"id": "team", "max_in_flight": 0}, "principals[0].max_in_flight: "),
        ({"id": "team", "max_queued": 17}, "principals[0].max_queued: must not exceed"),
        ({"id": "team", "budget": {"tokens": 0, "period": "day"}}, "principals[0].budget.tokens"),
        ({"id": "team", "seats": 3}, "principals[0].seats: unknown key"),
        ({"rpm": 5}, "principals[0].id: is required"),
    ],
    ids=["zero-rpm", "negative-tpm", "zero-in-flight", "queue", "zero-budget", "unknown", "no-id"],
)
def test_a_bad_principal_is_refused_with_its_path_r_mgd_13(entry: dict, issue: str) -> None:
    """R-MGD-13: unknown keys, zero or negative limits, a queue share over the queue."""
    issues = load_issues(with_principals(entry))
    assert len(issues) == 1 and issues[0].startswith(issue), issues


def test_a_repeated_principal_id_is_refused_r_mgd_13() -> None:
    """R-MGD-13: one entry per principal."""
    issues = load_issues(with_principals({"id": "team"}, {"id": "team", "rpm": 1}))
    assert len(issues) == 1 and issues[0].startswith("principals[1].id: "), issues


def test_a_token_budget_disagreeing_with_its_principal_is_refused_r_mgd_13() -> None:
    """R-MGD-13: a token's ``budget`` is accepted when it equals its principal's entry and
    refused, naming both places, when it does not."""
    week = {"tokens": 1000, "period": "week"}
    issues = load_issues(with_principals({"id": "team", "budget": DAY}, tokens=[{"budget": week}]))
    assert issues == [
        "openai.principal_tokens[0].budget: differs from the budget of principal 'team' at "
        "principals[0].budget: a budget is the principal's; state it there"
    ]
    issues = load_issues(with_principals({"id": "team"}, tokens=[{"budget": DAY}]))
    assert len(issues) == 1 and "principals[0].budget" in issues[0]
