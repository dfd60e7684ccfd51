"""Provider health keys at load: defaults, bounds, and errors that name the path
(R-HEALTH-1..3)."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.config import ConfigError, load_snapshot
from pool.policy import policy_from_snapshot
from tests.support.config_examples import example_document


def _issues(document: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_snapshot(document)
    return [str(issue) for issue in caught.value.issues]


def _provider(document: dict[str, Any], provider_id: str) -> dict[str, Any]:
    return next(p for p in document["nodes"][0]["providers"] if p["id"] == provider_id)


def test_health_keys_default_to_the_documented_values() -> None:
    snapshot = load_snapshot(example_document())
    assert (
        snapshot.retry_before_first_byte,
        snapshot.eject_after_failures,
        snapshot.eject_base_s,
        snapshot.eject_max_s,
    ) == (1, 3, 10.0, 300.0)
    assert all(p.probe_interval_s == 0.0 for p in snapshot.providers.values())
    # Omitted keys stay out of the canonical document, so older revisions diff clean.
    assert "eject_base_s" not in snapshot.document["provider_pool"]


def test_health_keys_reach_the_pool_policy() -> None:
    document = example_document()
    document["provider_pool"].update(
        retry_before_first_byte=3, eject_after_failures=0, eject_base_s=2.5, eject_max_s=60
    )
    snapshot = load_snapshot(document)
    health = policy_from_snapshot(snapshot).health
    assert (health.eject_after_failures, health.eject_base_s, health.eject_max_s) == (0, 2.5, 60)
    assert snapshot.retry_before_first_byte == 3
    assert snapshot.document["provider_pool"]["eject_base_s"] == 2.5


def test_a_base_larger_than_the_default_max_raises_the_max_with_it() -> None:
    document = example_document()
    document["provider_pool"]["eject_base_s"] = 600
    assert load_snapshot(document).eject_max_s == 600.0


@pytest.mark.parametrize(
    ("pool", "path"),
    [
        ({"retry_before_first_byte": 4}, "provider_pool.retry_before_first_byte"),
        ({"retry_before_first_byte": -1}, "provider_pool.retry_before_first_byte"),
        ({"eject_after_failures": -1}, "provider_pool.eject_after_failures"),
        ({"eject_base_s": 0}, "provider_pool.eject_base_s"),
        ({"eject_max_s": 100000}, "provider_pool.eject_max_s"),
        ({"eject_base_s": 30, "eject_max_s": 20}, "provider_pool.eject_max_s"),
    ],
)
def test_out_of_bounds_health_keys_are_refused_at_their_path(
    pool: dict[str, Any], path: str
) -> None:
    document = example_document()
    document["provider_pool"].update(pool)
    issues = _issues(document)
    assert len(issues) == 1 and issues[0].startswith(path + ": "), issues


def test_eject_max_below_base_names_both_values() -> None:
    document = example_document()
    document["provider_pool"].update(eject_base_s=30, eject_max_s=20)
    assert _issues(document) == ["provider_pool.eject_max_s: must be >= eject_base_s (30), got 20"]


def test_probe_keys_are_checked_per_provider_r_health_3() -> None:
    document = example_document()
    _provider(document, "compat-a")["probe_interval_s"] = 0.5
    _provider(document, "compat-a")["probe_command"] = ["true"]
    assert sorted(_issues(document)) == [
        "nodes[0].providers[0].probe_command: is only for cli providers",
        "nodes[0].providers[0].probe_interval_s: must be 0 (off) or >= 1, got 0.5",
    ]


def test_a_cli_provider_takes_a_probe_command_r_health_3() -> None:
    document = example_document()
    _provider(document, "cli-a").update(probe_interval_s=30, probe_command=["true"])
    spec = load_snapshot(document).providers["cli-a"]
    assert (spec.probe_interval_s, spec.probe_command) == (30.0, ("true",))
