"""Admission across Edges (R-LIM-1, R-MGD-13 with R-SCALE-6): two Edge processes on this
machine's PostgreSQL and Redis. A request whose body is still arriving on one Edge counts in
flight, in Redis, from its headers: the other Edge refuses the token's (or the principal's)
next request until that body is answered. A budget spent on one Edge while a body arrives
on the other refuses that body once the other Edge knows of the spending (R-LIM-3)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import redis

from tests.support.cluster import Cluster, postgres_test_url, scale_out_marks, scale_out_redis_url
from tests.support.processes import sha256_hex
from tests.support.rawhttp import SlowBody
from tests.support.scale_failures import eventually

DATABASE = postgres_test_url()
pytestmark = scale_out_marks()
CHAT: dict[str, Any] = {"model": "gpt-test", "messages": [{"role": "user", "content": "hi"}]}
# name -> (principal, policy)
TOKENS: dict[str, tuple[str, dict[str, Any]]] = {
    "single": ("team-single", {"max_in_flight": 1}),
    "pair-a": ("team-pair", {}),
    "pair-b": ("team-pair", {}),
    "budget-slow": ("team-budget", {}),
    "budget-spender": ("team-budget", {}),
    "budget-probe": ("team-budget", {}),
}
USED = 11 + 7  # the fake upstream's usage per chat completion (prompt + completion)
RAW = {name: f"{name}-" + secrets.token_urlsafe(24) for name in TOKENS}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tokens = [
        {"token_ref": f"tok-{n}", "principal_ref": p, "token_hash_sha256": sha256_hex(RAW[n]), **x}
        for n, (p, x) in TOKENS.items()
    ]
    with Cluster(
        tmp_path_factory.mktemp("admission"),
        database_url=DATABASE,
        edges=2,
        redis_url=scale_out_redis_url(),
        database_prefix="iop_scale_admission",
        tokens=tokens,
        principals=[
            {"id": "team-pair", "max_in_flight": 1},
            {"id": "team-budget", "budget": {"tokens": USED, "period": "day"}},
        ],
    ) as started:
        assert started.chat(0)[0] == 200  # past the fresh prefix's recovery grace
        yield started


def slots(cluster: Cluster, key: str) -> int:
    """In-flight slots held in Redis under a limiter key (a token ref, or a principal's)."""
    client = redis.Redis.from_url(str(cluster.redis_url))
    try:
        return int(client.zcard(f"{cluster.redis_prefix}:lim:{key}:fly"))
    finally:
        client.close()


def ask(cluster: Cluster, index: int, name: str) -> tuple[int, str]:
    """(status, error message or '') of one chat through Edge ``index``."""
    url = cluster.edges[index].openai_url + "/v1"
    with openai.OpenAI(base_url=url, api_key=RAW[name], max_retries=0, timeout=30) as sdk:
        try:
            sdk.chat.completions.create(**CHAT)
            return 200, ""
        except openai.APIStatusError as exc:
            return exc.status_code, str(exc.response.json()["error"]["message"])


@pytest.mark.parametrize(
    ("held", "other", "key", "who"),
    [
        ("single", "single", "tok-single", "token"),
        ("pair-a", "pair-b", " team-pair", "principal"),
    ],
    ids=["token", "principal"],
)
def test_a_body_arriving_on_one_edge_counts_in_flight_on_the_other_r_lim_1(
    cluster: Cluster, held: str, other: str, key: str, who: str
) -> None:
    """R-LIM-1 across Edges: ``max_in_flight: 1`` (a token's; a principal's over two of its
    tokens, R-MGD-13). A request sends its headers and one body byte to Edge 0; once its
    slot is in Redis, the next request on Edge 1 is refused 429 naming the limit; the held
    body, finished, is served, and then Edge 1 serves again."""
    eventually(lambda: slots(cluster, key) == 0, "no earlier slot held")
    body = SlowBody(cluster.edges[0].ports["openai"], "/v1/chat/completions", RAW[held], CHAT)
    try:
        eventually(lambda: slots(cluster, key) == 1, "the arriving body's slot in Redis")
        assert ask(cluster, 1, other) == (
            429,
            f"rate limit reached for this {who} (max_in_flight)",
        )
        status, _, answer = body.finish()
        assert status == 200, answer
        assert json.loads(answer)["choices"][0]["message"]["content"]
    finally:
        body.close()
    eventually(lambda: ask(cluster, 1, other)[0] == 200, "Edge 1 serving once the body ended")


def test_a_budget_spent_on_one_edge_refuses_a_body_arriving_on_the_other_r_lim_3(
    cluster: Cluster,
) -> None:
    """R-LIM-3 (two Edges), R-LIM-1: a body of a budgeted principal is still arriving on
    Edge 1 when another of its tokens spends the budget on Edge 0. Once Edge 1 knows of the
    spending (its ledger read, docs/metering.md "Budgets": within 10 s; a third token of the
    principal on Edge 1 is the probe), the body, finished, gets 429 budget_exceeded: it had
    passed the budget check with its headers, but admission is decided on the state at its
    end."""
    body = SlowBody(cluster.edges[1].ports["openai"], "/v1/chat/completions",
                    RAW["budget-slow"], CHAT)  # fmt: skip
    try:
        assert ask(cluster, 0, "budget-spender")[0] == 200
        eventually(
            lambda: ask(cluster, 1, "budget-probe")[0] == 429,
            "Edge 1 refusing the principal once the spending is in the ledger",
            within=30,
        )
        status, headers, answer = body.finish()
    finally:
        body.close()
    assert (status, json.loads(answer)["error"]["code"]) == (429, "budget_exceeded")
    assert headers["x-budget-remaining-tokens"] == "0"
