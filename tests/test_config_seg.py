"""Stream Evidence Gate config: defaults and bounds (R-SEG-1..3)."""

from __future__ import annotations

import pytest

from catalog.config import StreamFilter, load_snapshot
from tests.support.config import load_issues
from tests.support.config_examples import example_document


def _with_gate(**gate) -> dict:
    document = example_document()
    document["openai"]["stream_evidence_gate"] = gate
    return document


def test_gate_is_disabled_by_default_r_seg_1():
    """R-SEG-1: omitted -> enabled false, with the documented defaults."""
    gate = load_snapshot(example_document()).stream_evidence_gate
    assert gate.enabled is False
    assert (gate.request_fault_recovery, gate.ingress_snapshot_bytes) == (1, 1048576)
    assert dict(gate.strategy_caps) == {} and gate.filters == ()


def test_enabled_true_loads_into_the_snapshot_r_seg_1():
    """R-SEG-1: enabled true loads (what it does: tests/test_gate_relay.py, test_gate_e2e.py)."""
    assert load_snapshot(_with_gate(enabled=True)).stream_evidence_gate.enabled is True


@pytest.mark.parametrize("value", [0, 1, 2, 3])
def test_request_fault_recovery_accepts_0_to_3_r_seg_2(value):
    """R-SEG-2: request fault recovery is 0..3."""
    gate = load_snapshot(_with_gate(request_fault_recovery=value)).stream_evidence_gate
    assert gate.request_fault_recovery == value


@pytest.mark.parametrize(("value", "message"), [(-1, "must be >= 0"), (4, "must be <= 3")])
def test_request_fault_recovery_outside_0_to_3_is_rejected_r_seg_2(value, message):
    """R-SEG-2: request fault recovery outside 0..3 is a load error."""
    assert load_issues(_with_gate(request_fault_recovery=value)) == [
        f"openai.stream_evidence_gate.request_fault_recovery: {message}"
    ]


def test_each_strategy_cap_is_at_most_the_request_total_r_seg_2():
    """R-SEG-2: a strategy cap above request_fault_recovery is rejected at that cap."""
    document = _with_gate(
        request_fault_recovery=2, strategy_caps={"resample": 3, "switch_provider": 2}
    )
    assert load_issues(document) == [
        "openai.stream_evidence_gate.strategy_caps.resample: must be <= request_fault_recovery (2)"
    ]
    document = _with_gate(
        request_fault_recovery=2, strategy_caps={"resample": 1, "switch_provider": 2}
    )
    caps = load_snapshot(document).stream_evidence_gate.strategy_caps
    assert dict(caps) == {"resample": 1, "switch_provider": 2}


def test_cap_rule_uses_the_default_total_and_still_runs_beside_other_errors_r_seg_2():
    """R-SEG-2: with request_fault_recovery omitted (1), a cap of 2 is rejected."""
    document = _with_gate(strategy_caps={"switch_provider": 2}, ingress_snapshot_bytes=0)
    assert load_issues(document) == [
        "openai.stream_evidence_gate.ingress_snapshot_bytes: must be >= 1",
        "openai.stream_evidence_gate.strategy_caps.switch_provider: "
        "must be <= request_fault_recovery (1)",
    ]


def test_unknown_strategy_is_rejected_r_seg_2():
    """R-SEG-2: only the known strategies take caps."""
    assert load_issues(_with_gate(strategy_caps={"retry_forever": 1})) == [
        "openai.stream_evidence_gate.strategy_caps.retry_forever: unknown key"
    ]


@pytest.mark.parametrize(
    ("value", "message"), [(0, "must be >= 1"), (16777217, "must be <= 16777216")]
)
def test_ingress_snapshot_bytes_is_1_to_16mib_r_seg_2(value, message):
    """R-SEG-2: ingress snapshot bytes are 1..16777216."""
    assert load_issues(_with_gate(ingress_snapshot_bytes=value)) == [
        f"openai.stream_evidence_gate.ingress_snapshot_bytes: {message}"
    ]
    for ok in (1, 16777216):
        gate = load_snapshot(_with_gate(ingress_snapshot_bytes=ok)).stream_evidence_gate
        assert gate.ingress_snapshot_bytes == ok


def test_hold_evidence_runes_defaults_to_500_r_seg_3():
    """R-SEG-3: filters[].hold_evidence_runes defaults to 500."""
    gate = load_snapshot(_with_gate(filters=[{"type": "repeat_guard"}])).stream_evidence_gate
    assert gate.filters == (StreamFilter("repeat_guard", 500),)


@pytest.mark.parametrize(("value", "ok"), [(1, True), (65536, True), (0, False), (65537, False)])
def test_hold_evidence_runes_is_1_to_65536_r_seg_3(value, ok):
    """R-SEG-3: hold_evidence_runes outside 1..65536 is a load error."""
    document = _with_gate(filters=[{"type": "repeat_guard", "hold_evidence_runes": value}])
    if ok:
        filters = load_snapshot(document).stream_evidence_gate.filters
        assert filters[0].hold_evidence_runes == value
    else:
        (message,) = load_issues(document)
        assert message.startswith("openai.stream_evidence_gate.filters[0].hold_evidence_runes:")


def test_unknown_filter_type_is_rejected_r_seg_3():
    """R-SEG-3: repeat_guard is the filter type."""
    (message,) = load_issues(_with_gate(filters=[{"type": "profanity"}]))
    assert message == "openai.stream_evidence_gate.filters[0].type: must be one of 'repeat_guard'"


def test_enforcement_defaults_to_enforce_and_takes_observe_r_seg_8():
    """R-SEG-8: filters[].enforcement is enforce unless set to observe."""
    gate = load_snapshot(_with_gate(filters=[{"type": "repeat_guard"}])).stream_evidence_gate
    assert gate.filters[0].enforcement == "enforce"
    observe = [{"type": "repeat_guard", "enforcement": "observe"}]
    assert load_snapshot(_with_gate(filters=observe)).stream_evidence_gate.filters[0] == (
        StreamFilter("repeat_guard", 500, "observe")
    )


def test_unknown_enforcement_is_rejected_naming_the_path_r_seg_8():
    """R-SEG-8: only enforce and observe load."""
    issues = load_issues(_with_gate(filters=[{"type": "repeat_guard", "enforcement": "warn"}]))
    path = "openai.stream_evidence_gate.filters[0].enforcement"
    assert f"{path}: must be one of 'enforce' or 'observe'" in issues
