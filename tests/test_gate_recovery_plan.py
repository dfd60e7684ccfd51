"""Which recovery a fired gate takes, and what it re-issues (R-SEG-4, R-SEG-6)."""

from __future__ import annotations

from pool.gate.recovery import (
    RESAMPLE,
    SWITCH_PROVIDER,
    TEMPERATURE_CANDIDATES,
    RecoveryPlan,
    continuation,
)


def test_resample_comes_first_then_switch_provider_within_each_cap_r_seg_6() -> None:
    """R-SEG-6: the fixed order, each strategy within its cap, all within the total."""
    plan = RecoveryPlan(3, {"resample": 1, "switch_provider": 2})
    assert [plan.next(can_switch=True) for _ in range(4)] == [
        RESAMPLE,
        SWITCH_PROVIDER,
        SWITCH_PROVIDER,
        None,
    ]


def test_an_omitted_cap_is_the_request_total_r_seg_2() -> None:
    """R-SEG-2: without caps, the total alone bounds the recoveries."""
    plan = RecoveryPlan(2, {})
    assert [plan.next(can_switch=True) for _ in range(3)] == [RESAMPLE, RESAMPLE, None]


def test_switch_provider_is_skipped_when_no_other_candidate_is_left_r_seg_6() -> None:
    """R-SEG-6: a group with one provider only resamples; then recovery is exhausted."""
    plan = RecoveryPlan(3, {"resample": 1})
    assert plan.next(can_switch=False) == RESAMPLE
    assert plan.next(can_switch=False) is None


def test_zero_recoveries_means_the_first_fire_is_exhausted_r_seg_2() -> None:
    """R-SEG-2: request_fault_recovery 0 never re-issues."""
    assert RecoveryPlan(0, {}).next(can_switch=True) is None


def test_the_nth_resample_takes_the_nth_temperature_skipping_the_clients_own_r_seg_4() -> None:
    """R-SEG-4: the candidate order is fixed; one equal to the client's value is skipped."""
    plan = RecoveryPlan(3, {}, client_temperature=TEMPERATURE_CANDIDATES[0])
    temperatures = []
    for _ in range(3):
        assert plan.next(can_switch=False) == RESAMPLE
        temperatures.append(plan.temperature())
    assert temperatures == list(TEMPERATURE_CANDIDATES[1:4])


def test_the_continuation_appends_the_delivered_text_as_the_assistants_answer_r_seg_6() -> None:
    """R-SEG-6: the ingress snapshot, unchanged, plus the partial answer to continue from."""
    snapshot = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    data = continuation(snapshot, "Half an ans", 0.7)
    assert data["messages"] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Half an ans"},
    ]
    assert data["temperature"] == 0.7 and data["stream"] is True
    assert snapshot == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    assert continuation(snapshot, "", None) == snapshot  # nothing delivered: no partial
