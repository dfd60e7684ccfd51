"""Budgets and fallback chains at load (R-BUD-1, R-FALL-1, R-FALL-2): what loads, and every
refusal with the path it names."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.config import load_snapshot
from catalog.config.schema.catalog import MAX_FALLBACKS
from tests.support.config import load_issues
from tests.support.config_examples import example_document

HASH_A, HASH_B = "a" * 64, "b" * 64


def with_tokens(*tokens: dict[str, Any]) -> dict[str, Any]:
    document = example_document()
    document["openai"]["principal_tokens"] = [
        {"token_ref": f"app-{i}", "token_hash_sha256": f"{i:x}" * 64, "principal_ref": "team", **t}
        for i, t in enumerate(tokens, start=10)
    ]
    return document


def with_groups(groups: list[dict[str, Any]]) -> dict[str, Any]:
    document = example_document()
    provider = next(iter(document["models"][0]["providers"]))
    document["models"] = [{"providers": {provider: "served"}, **g} for g in groups]
    document["openai"]["principal_tokens"] = [
        t for t in document["openai"].get("principal_tokens", []) if "models" not in t
    ]
    return document


def test_a_budget_loads_into_the_snapshot_and_the_document_r_bud_1() -> None:
    """R-BUD-1: ``{tokens, period}`` on a token, the same on every token of its principal."""
    budget = {"tokens": 5000, "period": "month"}
    snapshot = load_snapshot(with_tokens({"budget": budget}, {"budget": budget}))
    assert {(t.budget.tokens, t.budget.period) for t in snapshot.principal_tokens if t.budget} == {
        (5000, "month")
    }
    assert snapshot.document["openai"]["principal_tokens"][0]["budget"] == budget


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"tokens": 0, "period": "day"}, "tokens: "),
        ({"tokens": -5, "period": "day"}, "tokens: "),
        ({"tokens": 2.5, "period": "day"}, "tokens: must be an integer"),
        ({"tokens": "1000", "period": "day"}, "tokens: must be an integer"),
        ({"tokens": 1000, "period": "year"}, "period: "),
        ({"tokens": 1000}, "period: is required"),
        ({"tokens": 1000, "period": "day", "usd": 5}, "usd: unknown key"),
    ],
    ids=["zero", "negative", "fraction", "string", "unknown-period", "no-period", "extra-key"],
)
def test_a_bad_budget_is_refused_with_its_path_r_bud_1(budget: dict, message: str) -> None:
    """R-BUD-1: 0 is refused (revoke or narrow the token to stop a principal), as are a
    negative or non-integer figure and a period other than day, week or month."""
    issues = load_issues(with_tokens({"budget": budget}))
    assert len(issues) == 1, issues
    assert issues[0].startswith(f"openai.principal_tokens[0].budget.{message}"), issues


def test_tokens_of_one_principal_with_different_budgets_are_refused_r_bud_1() -> None:
    """R-BUD-1: the budget is the principal's: stated once, or the same each time."""
    day, week = {"tokens": 10, "period": "day"}, {"tokens": 10, "period": "week"}
    issues = load_issues(with_tokens({"budget": day}, {"budget": week}))
    assert len(issues) == 1 and issues[0].startswith("openai.principal_tokens[1].budget: differs")
    snapshot = load_snapshot(with_tokens({"budget": day}, {}))
    assert snapshot.principal_tokens[1].budget is None  # the principal's budget still holds


def test_a_chain_resolves_depth_first_each_group_once_r_fall_1() -> None:
    """R-FALL-1: a group's own fallbacks, each followed by its own chain."""
    snapshot = load_snapshot(
        with_groups(
            [
                {"id": "a", "fallbacks": ["b", "c"]},
                {"id": "b", "fallbacks": ["c", "d"]},
                {"id": "c"},
                {"id": "d"},
            ]
        )
    )
    assert snapshot.models["a"].fallbacks == ("b", "c", "d")
    assert snapshot.models["c"].fallbacks == ()


def test_a_ten_group_chain_loads_r_fall_2() -> None:
    """R-FALL-2: g0 -> g1 -> ... -> g9 loads; g0 reaches the nine others in order."""
    groups = [{"id": f"g{i}", "fallbacks": [f"g{i + 1}"]} for i in range(9)] + [{"id": "g9"}]
    snapshot = load_snapshot(with_groups(groups))
    assert snapshot.models["g0"].fallbacks == tuple(f"g{i}" for i in range(1, 10))


def test_a_chain_longer_than_the_maximum_is_refused_r_fall_2() -> None:
    """R-FALL-2: at most MAX_FALLBACKS groups after the requested one."""
    n = MAX_FALLBACKS + 2
    groups = [{"id": f"g{i}", "fallbacks": [f"g{i + 1}"]} for i in range(n - 1)] + [
        {"id": f"g{n - 1}"}
    ]
    issues = load_issues(with_groups(groups))
    assert issues and issues[0] == (
        f"models[0].fallbacks: the fallback chain reaches {n - 1} groups (at most {MAX_FALLBACKS})"
    )


@pytest.mark.parametrize(
    ("groups", "expected"),
    [
        (
            [{"id": "a", "fallbacks": ["b"]}, {"id": "b", "fallbacks": ["a"]}],
            ["models[0].fallbacks: the fallback chain loops: a -> b -> a",
             "models[1].fallbacks: the fallback chain loops: b -> a -> b"],
        ),
        (
            [{"id": "a", "fallbacks": ["a"]}],
            ["models[0].fallbacks: the fallback chain loops: a -> a"],
        ),
        (
            [{"id": "a", "fallbacks": ["nope"]}],
            ["models[0].fallbacks[0]: unknown model group 'nope'"],
        ),
    ],
    ids=["loop", "self", "unknown"],
)  # fmt: skip
def test_loops_and_unknown_groups_are_refused_with_the_path_r_fall_2(
    groups: list[dict[str, Any]], expected: list[str]
) -> None:
    """R-FALL-2: a loop or an unknown group is refused at load, naming the path."""
    assert load_issues(with_groups(groups)) == expected


def test_a_chain_between_glm_general_and_coding_plan_is_refused_r_fall_2() -> None:
    """R-FALL-2, R-PROF-7b: no fallback may carry a request across the two GLM plans, even
    through a group in between."""
    document = example_document()
    node = document["nodes"][0]
    node["providers"] += [
        {"id": "zai-general", "profile": "glm", "credential": {"env": "ZAI_API_KEY"}},
        {"id": "zai-coding", "profile": "glm_coding", "credential": {"env": "ZAI_CODING_KEY"}},
    ]
    other = next(iter(document["models"][0]["providers"]))
    document["models"] = [
        {"id": "general", "providers": {"zai-general": "glm-4.6"}, "fallbacks": ["neutral"]},
        {"id": "neutral", "providers": {other: "x"}, "fallbacks": ["coding"]},
        {"id": "coding", "providers": {"zai-coding": "glm-4.6"}},
    ]
    document["openai"]["principal_tokens"] = [
        t for t in document["openai"].get("principal_tokens", []) if "models" not in t
    ]
    issues = load_issues(document)
    assert [i.split(":")[0] for i in issues] == ["models[0].fallbacks"]  # neutral -> coding is fine
    assert all("GLM General and GLM Coding Plan" in i for i in issues)
