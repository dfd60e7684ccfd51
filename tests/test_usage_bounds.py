"""One bad usage figure never stops metering (R-IN-6): the rule, the adapters, the ledger."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import yaml

from catalog.config import load_snapshot
from nodes.agent.adapters.base import usage_from
from nodes.agent.adapters.ollama import _usage
from nodes.tokens import MAX_TOKENS, token_figure
from nodes.wire import Usage
from pool.metering import UsageMeter
from pool.models import UsageBucket
from tests.support.metering import record_factory
from tests.support.processes import EDGE_YAML

HOUR_0 = 1_759_996_800


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (12, 12),
        (0, 0),
        (12.0, 12),
        ("12", 12),
        (MAX_TOKENS - 1, MAX_TOKENS - 1),
        (None, 0),
    ],
)
def test_r_in_6_plausible_counts_pass_unchanged(value: object, expected: int) -> None:
    """R-IN-6: integers, integral floats and digit strings are counts."""
    assert token_figure(value, "test") == expected


@pytest.mark.parametrize(
    "value",
    [-1, 2**63, 2**70, MAX_TOKENS, "abc", "-3", 1.5, float("nan"), float("inf"), True, [], {}],
)
def test_r_in_6_negative_huge_or_non_numeric_counts_are_zero_with_a_log_line(
    value: object, caplog: pytest.LogCaptureFixture
) -> None:
    """R-IN-6: dropped to 0, and the log says so."""
    with caplog.at_level(logging.WARNING, logger="iop.usage"):
        assert token_figure(value, "test input_tokens") == 0
    assert "test input_tokens" in caplog.text


def test_r_in_6_upstream_usage_with_a_huge_and_a_negative_figure_is_clamped() -> None:
    """R-IN-6: an OpenAI-shaped usage object from the upstream, on the Node."""
    assert usage_from({"prompt_tokens": 2**64, "completion_tokens": -7}) == Usage(0, 0)
    assert usage_from({"input_tokens": "9", "output_tokens": 3}) == Usage(9, 3)
    assert usage_from({"foo": 1}) is None


def test_r_in_6_a_non_numeric_ollama_count_does_not_fail_the_run() -> None:
    """R-IN-6: the Ollama adapter used ``int()`` on the counts; a word raised."""
    assert _usage({"prompt_eval_count": "many", "eval_count": 4}) == Usage(0, 4)


record = record_factory(duration_s=0.1, stream=False)


@pytest.mark.django_db(transaction=True)
async def test_r_in_6_a_huge_figure_reaching_the_meter_does_not_stop_the_ledger() -> None:
    """R-IN-6: a 2**63 count (past SQLite's and PostgreSQL's bigint) is counted as 0; that
    batch and every later one are written."""
    from asgiref.sync import sync_to_async

    active = load_snapshot(yaml.safe_load(EDGE_YAML.read_text()))  # has qwen-local, app-notebook
    meter = UsageMeter(lambda: active, flush_interval_s=60.0, retention_days=0,
                       clock=lambda: HOUR_0 + 60.0)  # fmt: skip
    meter.record(record(input_tokens=2**63, output_tokens=5))
    assert await meter.flush() == 1
    meter.record(record(input_tokens=10, output_tokens=20))
    assert await meter.flush() == 1
    await meter.aclose()

    def totals() -> list[Any]:
        return list(UsageBucket.objects.values_list("requests", "input_tokens", "output_tokens"))

    assert await sync_to_async(totals)() == [(2, 10, 25)]
