"""``principals:`` on real processes (R-MGD-13): a principal's budget and limits count all its
keys together, in managed mode too, where a route key is its principal's key and is metered
as (principal, route) on the ledger and ``/metrics``. Managed mode runs over TLS with keys
minted in the test (tests/support/managed.py)."""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.managed import managed_stack, mint_keys
from tests.support.stack import Stack
from tests.support.tls import Pki

pytestmark = pytest.mark.slow

USED = 11 + 7  # the fake upstream's usage per chat completion (prompt + completion)
CHAT: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}


class Routes:
    def __init__(self, stack: Stack, pki: Pki) -> None:
        self.stack, self.pki = stack, pki
        self.keys: dict[str, str] = {}

    def create(self, route: str, principal: str) -> None:
        before = self.stack.pool_snapshot()["credential_table"]["version"]
        out = self.stack.manage(
            "iop_route", "create", route, "--model", "glm", "--slot", "glm=glm-main",
            "--principal-ref", principal, "--json",
        )  # fmt: skip
        self.keys[route] = json.loads(out)["key"]
        self.stack.wait_until(
            lambda snap: snap["credential_table"]["version"] != before, what="the route table"
        )

    def chat(self, route: str) -> Any:
        client = openai.OpenAI(
            base_url=self.stack.v1_url,
            api_key=self.keys[route],
            http_client=httpx.Client(verify=ssl.create_default_context(cafile=self.pki.ca_file)),
            max_retries=0,
        )
        with client:
            return client.chat.completions.with_raw_response.create(model="glm", **CHAT)


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routes]:
    directory = tmp_path_factory.mktemp("principals")
    pki = Pki(directory / "pki")
    keys = mint_keys(directory / "keys", "node-1")
    principals = [
        {"id": "research", "budget": {"tokens": USED, "period": "day"}},
        {"id": "ops", "rpm": 2},
    ]
    with managed_stack(directory, pki, keys, principals=principals) as stack:
        out = Routes(stack, pki)
        before = stack.pool_snapshot()["credential_table"]["version"]
        stack.manage("iop_slot", "set", "glm-main", "--profile", "glm", stdin=b"sk-principals")
        stack.wait_until(
            lambda snap: snap["credential_table"]["version"] != before, what="the slot"
        )
        for route, principal in [("lab", "research"), ("ops-a", "ops"), ("ops-b", "ops")]:
            out.create(route, principal)
        yield out


def test_a_route_key_over_its_principal_s_budget_gets_429_and_is_metered_as_it_r_mgd_13(
    routes: Routes,
) -> None:
    """R-MGD-13: in managed mode a route key is its principal's key: the principal's budget
    holds (x-budget-* on every answer, 429 budget_exceeded once spent), and its usage is
    on the ledger and /metrics as (principal, route id), never ``-``."""
    first = routes.chat("lab")
    assert first.headers["x-budget-limit-tokens"] == str(USED)
    assert first.headers["x-budget-remaining-tokens"] == str(USED)
    with pytest.raises(openai.RateLimitError) as refused:
        routes.chat("lab")
    assert refused.value.code == "budget_exceeded"
    assert refused.value.response.headers["x-budget-remaining-tokens"] == "0"
    stack = routes.stack
    stack.wait_until(
        lambda _: any(r["principal_ref"] == "research" for r in stack.ledger()),
        what="the ledger row of the route key",
    )
    rows = [r for r in stack.ledger() if r["principal_ref"] == "research"]
    assert {r["token_ref"] for r in rows} == {"lab"}
    assert sum(r["input_tokens"] + r["output_tokens"] for r in rows) == USED
    served = [
        s for s in stack.metrics()
        if s.name == "iop_tokens_total" and s.labels.get("principal_ref") == "research"
    ]  # fmt: skip
    assert served and {s.labels["token_ref"] for s in served} == {"lab"}


def test_a_principal_s_rpm_counts_all_its_route_keys_together_r_mgd_13(routes: Routes) -> None:
    """R-MGD-13: ``rpm: 2`` on the principal: one request on each of its two route keys,
    then the third on either is 429 rate_limited naming the principal."""
    assert routes.chat("ops-a").status_code == 200
    assert routes.chat("ops-b").status_code == 200
    with pytest.raises(openai.RateLimitError) as refused:
        routes.chat("ops-a")
    assert refused.value.code == "rate_limited"
    assert "principal (rpm)" in refused.value.message
    assert int(refused.value.response.headers["retry-after"]) >= 1
