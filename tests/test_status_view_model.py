"""How the status page classifies and orders providers (pure functions of the pool snapshot)."""

from __future__ import annotations

from typing import Any

import pytest

from pool.status import format_left, format_wait, health_text, provider_state, status_view


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
        "health": "healthy",
        "health_reason": "",
        "ejected_for_s": 0.0,
        "consecutive_failures": 0,
    }
    return {**row, **figures}


EJECTED = {"health": "ejected", "health_reason": "cannot connect to the upstream"}


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
        ({**EJECTED, "ejected_for_s": 9.2}, "ejected"),  # R-HEALTH-4
        ({**EJECTED, "in_flight": 2}, "ejected"),  # health wins over load
        ({"health": "probing", "health_reason": "x"}, "probing"),
        ({**EJECTED, "enabled": False}, "disabled"),
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
        "ejected": 0,
        "probing": 0,
        "saturated": 1,
        "busy": 1,
        "idle": 1,
        "disabled": 0,
        "unavailable": 0,
        "offline": 0,
    }
    assert view["queue_depth"] == 3
    assert (view["oldest_wait_ms"], view["oldest_wait"]) == (1500.0, "1.5 s")
    assert view["providers"][0] == {
        **_row("z", "n1", in_flight=2),
        "state": "saturated",
        "load_pct": 100,
        "health_text": "-",
        "gate": "0 / 0 / 0 / 0",
        "ttft": "-",
    }


def test_the_ttft_column_shows_p50_and_p95_of_the_recent_window_r_obs_3() -> None:
    """R-OBS-3: p50 / p95 time to first token per provider; "-" without recent samples."""
    snapshot = {
        "providers": [_row("a", "n1"), _row("b", "n1")],
        "queue_depth": 0,
        "oldest_wait_ms": 0.0,
        "ttft": {"a": {"p50_ms": 120.0, "p95_ms": 1500.0, "count": 3}},
    }
    view = status_view(snapshot)
    assert [row["ttft"] for row in view["providers"]] == ["120 ms / 1.5 s", "-"]
    assert view["ttft_window_min"] == 5


def test_the_health_column_names_the_reason_and_the_time_left_r_health_4() -> None:
    assert health_text(_row(**EJECTED, ejected_for_s=9.2)) == (
        "cannot connect to the upstream; back in 9 s"
    )
    assert health_text(_row(health="probing", health_reason="HTTP 503")) == (
        "one trial request after: HTTP 503"
    )
    assert health_text(_row()) == "-"
    assert [format_left(s) for s in (0.0, 0.2, 59.4, 125.0)] == ["", "1 s", "59 s", "2 min 5 s"]


def test_each_row_shows_its_gate_counts_in_a_fixed_order_r_seg_6() -> None:
    """R-SEG-6, R-SEG-8: fired / recovered / exhausted / observed per provider."""
    snapshot = {
        "providers": [_row("a"), _row("b")],
        "queue_depth": 0,
        "oldest_wait_ms": 0.0,
        "gate": {"a": {"fired": 3, "recovered": 2, "exhausted": 1, "observed": 0}},
    }
    rows = {r["provider_id"]: r["gate"] for r in status_view(snapshot)["providers"]}
    assert rows == {"a": "3 / 2 / 1 / 0", "b": "0 / 0 / 0 / 0"}


@pytest.mark.parametrize(
    ("ms", "text"), [(0.0, "-"), (12.4, "12 ms"), (999.0, "999 ms"), (61_250.0, "61.2 s")]
)
def test_format_wait_is_readable(ms: float, text: str) -> None:
    assert format_wait(ms) == text
