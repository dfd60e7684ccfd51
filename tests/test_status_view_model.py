"""How the status page classifies and orders providers (pure functions of the pool snapshot)."""

from __future__ import annotations

from typing import Any

import pytest

from pool.status import format_wait, provider_state, status_view


def _row(provider_id: str = "p", node_id: str = "n", **figures: Any) -> dict[str, Any]:
    row = {
        "node_id": node_id,
        "provider_id": provider_id,
        "online": True,
        "capacity": 2,
        "in_flight": 0,
        "long_in_flight": 0,
        "queued": 0,
        "priority": 10,
        "enabled": True,
        "long_capacity": 0,
    }
    return {**row, **figures}


@pytest.mark.parametrize(
    ("figures", "state"),
    [
        ({}, "idle"),
        ({"in_flight": 1}, "busy"),
        ({"in_flight": 2}, "saturated"),
        ({"in_flight": 2, "enabled": False}, "disabled"),  # draining leases after a disable
        ({"online": False, "enabled": False}, "offline"),  # offline wins over everything
        ({"online": False, "in_flight": 0}, "offline"),
        ({"online": False, "unavailable": "refused by node policy: ..."}, "unavailable"),
    ],
)
def test_provider_state_names_what_a_newcomer_needs_to_see(
    figures: dict[str, Any], state: str
) -> None:
    assert provider_state(_row(**figures)) == state


def test_status_view_sorts_rows_counts_states_and_keeps_engine_fields() -> None:
    snapshot = {
        "providers": [_row("b", "n2"), _row("z", "n1", in_flight=2), _row("a", "n2", in_flight=1)],
        "queue_depth": 3,
        "oldest_wait_ms": 1500.0,
    }
    view = status_view(snapshot)
    assert [(r["node_id"], r["provider_id"]) for r in view["providers"]] == [
        ("n1", "z"),
        ("n2", "a"),
        ("n2", "b"),
    ]
    assert [r["load_pct"] for r in view["providers"]] == [100, 50, 0]
    assert view["counts"] == {
        "saturated": 1, "busy": 1, "idle": 1, "disabled": 0, "unavailable": 0, "offline": 0
    }  # fmt: skip
    assert view["queue_depth"] == 3
    assert (view["oldest_wait_ms"], view["oldest_wait"]) == (1500.0, "1.5 s")
    assert view["providers"][0] == {
        **_row("z", "n1", in_flight=2),
        "state": "saturated",
        "load_pct": 100,
    }


@pytest.mark.parametrize(
    ("ms", "text"), [(0.0, "-"), (12.4, "12 ms"), (999.0, "999 ms"), (61_250.0, "61.2 s")]
)
def test_format_wait_is_readable(ms: float, text: str) -> None:
    assert format_wait(ms) == text
