"""A budget across several Edges (R-BUD-1): usage metered on one Edge is enforced by another
within the stated tolerance (each Edge flushes its usage and reads the ledger every 5 s:
docs/metering.md, "Budgets"). Two runedge processes on one PostgreSQL database."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import DATABASE, Cluster, needs_postgres, scale_out_redis_url

pytestmark = [pytest.mark.slow, needs_postgres]
TOLERANCE_S = 10.0  # the other Edge's flush interval plus this one's read interval
USED = 11 + 7  # the fake upstream's usage per chat completion


def spend_twice_on_edge_0_then_refused_on_edge_1(cluster: Cluster) -> dict[str, Any]:
    """Two requests through Edge 0 reach the budget; Edge 0 refuses the third at once and
    Edge 1 within the tolerance; Edge 1's refusal body."""
    assert cluster.chat(1, "no-such-model")[0] == 404  # Edge 1 reads the ledger from now
    for _ in range(2):
        status, body = cluster.chat(0)
        assert status == 200, body
    assert cluster.chat(0)[1]["error"]["code"] == "budget_exceeded"  # its own count
    spent_at = time.monotonic()
    while True:
        status, body = cluster.chat(1, "no-such-model")
        if status != 404:
            break
        assert time.monotonic() - spent_at < TOLERANCE_S + 5, (status, body)
        time.sleep(0.2)
    assert body["error"]["code"] == "budget_exceeded"
    assert time.monotonic() - spent_at < TOLERANCE_S + 5
    return body


def test_usage_on_one_edge_spends_the_budget_on_another_r_bud_1(tmp_path: Path) -> None:
    """R-BUD-1: the principal spends its budget through Edge 0; Edge 1 refuses it with 429
    budget_exceeded within the tolerance. Edge 1 is asked for a model that does not exist
    (404, no tokens) until then: the budget is checked first, so only the ledger read of
    Edge 0's usage can turn its answer into 429."""
    with Cluster(
        tmp_path,
        database_url=DATABASE,
        edges=2,
        redis_url=scale_out_redis_url(),
        token_policy={"budget": {"tokens": 2 * USED, "period": "day"}},
    ) as cluster:
        spend_twice_on_edge_0_then_refused_on_edge_1(cluster)


def test_spend_on_one_edge_spends_a_budget_in_money_on_another_r_cost_3(tmp_path: Path) -> None:
    """R-COST-3: a budget in money counts across Edges like one in tokens (the same counters,
    the same tolerance): two requests through Edge 0 spend 0.00005 USD (11 in at 1, 7 out at
    2 per million: 0.000025 each); Edge 0 refuses the third at once, Edge 1 within the
    tolerance, both with the amount headers."""
    with Cluster(
        tmp_path,
        database_url=DATABASE,
        edges=2,
        redis_url=scale_out_redis_url(),
        models=[
            {
                "id": "gpt-test",
                "providers": {"p-openai": "served-gpt"},
                "price": {"input": 1, "output": 2},
            }
        ],
        token_policy={"budget": {"amount": 0.00005, "period": "day"}},
    ) as cluster:
        body = spend_twice_on_edge_0_then_refused_on_edge_1(cluster)
        assert "0.00005 USD" in body["error"]["message"]
