"""Spend in money through a real Edge, Node and fake upstreams that report cached tokens, with
the official SDKs (R-COST-1..3): the ledger's and the request log's cost equal the figure
computed by hand to the last digit, natively and through translation in both directions;
``iop_spend_total`` agrees; a budget in money refuses with 429 ``budget_exceeded`` at the
request that finds it spent, with its ``x-budget-*`` headers in the currency."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest

from catalog.config.money import from_pico
from tests.support import Stack, sha256_hex
from tests.support.translation import PROVIDER_KEY, metric

pytestmark = pytest.mark.slow

CHAT_PRICE = {"input": 2.5, "output": 10, "cached_input": 1.25}
CLAUDE_GROUP_PRICE = {"input": 1, "output": 1}  # the provider's own price wins over it
CLAUDE_PRICE = {"input": 3, "output": 15, "cached_input": 0.3}
PROVIDERS = [
    {"id": "p-chat", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 4},
    {"id": "p-claude", "profile": "anthropic", "base_url": "{up:claude}/v1", "capacity": 4,
     "credential": {"env": "IOP_TEST_XLATE_KEY"}, "price": CLAUDE_PRICE},
]  # fmt: skip
MODELS = [
    {"id": "chat-priced", "providers": {"p-chat": "served-gpt"}, "price": CHAT_PRICE},
    {"id": "claude-over-chat", "providers": {"p-chat": "served-gpt"}, "translate": True,
     "price": CHAT_PRICE},
    {"id": "gpt-over-claude", "providers": {"p-claude": "claude-served"}, "translate": True,
     "price": CLAUDE_GROUP_PRICE},
]  # fmt: skip
# The fakes' usage: Chat 11 prompt tokens of which 6 cached, 7 out; Anthropic 17 fresh plus
# 100 read from the cache (apart from input_tokens), 9 out.
CHAT_USAGE = (11, 6, 7)
CLAUDE_USAGE = (117, 100, 9)
MONEY = "iop-spend-money-budget-zzzzzzzz"
USER = [{"role": "user", "content": "hi"}]


def by_hand(price: dict[str, float], tokens_in: int, cached: int, tokens_out: int) -> Decimal:
    per = {k: Decimal(str(v)) / 1_000_000 for k, v in price.items()}
    return (
        (tokens_in - cached) * per["input"]
        + cached * per["cached_input"]
        + (tokens_out * per["output"])
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    money_token = {"token_ref": "app-money", "principal_ref": "team-money",
                   "token_hash_sha256": sha256_hex(MONEY)}  # fmt: skip
    with Stack(
        tmp_path_factory.mktemp("spend"),
        upstreams={"main": "openai", "claude": "anthropic"},
        providers=PROVIDERS,
        models=MODELS,
        metering={"currency": "EUR"},
        tokens=[money_token],
        # two chat-priced requests: 0.00009 EUR each
        principals=[{"id": "team-money", "budget": {"amount": 0.00018, "period": "day"}}],
        env={"IOP_TEST_XLATE_KEY": PROVIDER_KEY},
    ) as running:
        running.upstream("main").server.cached_tokens = CHAT_USAGE[1]
        claude = running.upstream("claude").server
        claude.api_key = PROVIDER_KEY
        claude.cache_read_input_tokens = CLAUDE_USAGE[1]
        yield running


def rows_of(
    stack: Stack, table: str, group: str, count: int, principal: str = "team-test"
) -> list[dict[str, Any]]:
    """The ledger's (or request log's) rows of ``group`` and ``principal`` once they hold
    ``count`` requests (the meter writes every few seconds)."""
    deadline = time.monotonic() + 30
    while True:
        rows = [
            r
            for r in stack.ledger(table)
            if r["model_group"] == group and r["principal_ref"] == principal
        ]
        held = sum(r.get("requests", 1) for r in rows)
        if held >= count or time.monotonic() > deadline:
            assert held == count, (group, rows)
            return rows
        time.sleep(0.2)


def test_the_ledger_cost_equals_the_hand_computed_figure_r_cost_1_r_cost_2(stack: Stack) -> None:
    """R-COST-1, R-COST-2: cached input tokens read from each upstream's usage (Chat's
    prompt_tokens_details, Anthropic's cache_read_input_tokens) through a native group and
    both translation directions; each cost exact, on ledger and request-log rows and in
    /metrics, in the configured currency."""
    with openai.OpenAI(base_url=stack.v1_url, api_key=stack.token, max_retries=0) as oai:
        answer = oai.chat.completions.create(model="chat-priced", messages=USER)
        assert answer.usage is not None and answer.usage.prompt_tokens == 11
        chunks = list(oai.chat.completions.create(
            model="chat-priced", messages=USER, stream=True,
            stream_options={"include_usage": True},
        ))  # fmt: skip
        assert chunks[-1].usage is not None
        translated = oai.chat.completions.create(model="gpt-over-claude", messages=USER)
        assert translated.usage is not None
    with anthropic.Anthropic(base_url=stack.openai_url, api_key=stack.token, max_retries=0) as ant:
        message = ant.messages.create(model="claude-over-chat", max_tokens=32, messages=USER)
        assert message.usage.cache_read_input_tokens == CHAT_USAGE[1]
    expected = {
        "chat-priced": (2, 2 * by_hand(CHAT_PRICE, *CHAT_USAGE)),  # 0.00018
        "gpt-over-claude": (1, by_hand(CLAUDE_PRICE, *CLAUDE_USAGE)),  # 0.000216
        "claude-over-chat": (1, by_hand(CHAT_PRICE, *CHAT_USAGE)),  # 0.00009
    }
    assert expected["chat-priced"][1] == Decimal("0.00018")
    assert expected["gpt-over-claude"][1] == Decimal("0.000216")
    usage = {"chat-priced": CHAT_USAGE, "gpt-over-claude": CLAUDE_USAGE,
             "claude-over-chat": CHAT_USAGE}  # fmt: skip
    for group, (count, cost) in expected.items():
        rows = rows_of(stack, "pool_usagebucket", group, count)
        assert from_pico(sum(r["cost_pico"] for r in rows)) == cost, group
        assert sum(r["cached_input_tokens"] for r in rows) == count * usage[group][1], group
        assert sum(r["input_tokens"] for r in rows) == count * usage[group][0], group
        assert not any(r["estimated"] for r in rows), group
        logged = rows_of(stack, "pool_requestlogentry", group, count)
        assert from_pico(sum(r["cost_pico"] for r in logged)) == cost, group
        spend = metric(stack, "iop_spend_total", model_group=group, principal="team-test")
        assert spend == pytest.approx(float(cost), rel=1e-9), group
    claude_rows = rows_of(stack, "pool_usagebucket", "gpt-over-claude", 1)
    assert {r["attributed_to"] for r in claude_rows} == {"p-claude"}


def test_a_budget_in_money_refuses_the_request_that_finds_it_spent_r_cost_3(stack: Stack) -> None:
    """R-COST-3: 0.00018 EUR a day, 0.00009 EUR a request: the first two are served with the
    amount left in the headers, the third is 429 budget_exceeded in the client's shape."""
    with openai.OpenAI(base_url=stack.v1_url, api_key=MONEY, max_retries=0) as oai:
        create = oai.chat.completions.with_raw_response.create
        first = create(model="chat-priced", messages=USER)
        assert {k: v for k, v in first.headers.items() if k.startswith("x-budget-")} == {
            "x-budget-limit-amount": "0.00018",
            "x-budget-remaining-amount": "0.00018",
            "x-budget-currency": "EUR",
            "x-budget-reset": first.headers["x-budget-reset"],
        }
        second = create(model="chat-priced", messages=USER)
        assert second.headers["x-budget-remaining-amount"] == "0.00009"
        with pytest.raises(openai.RateLimitError) as refused:
            create(model="chat-priced", messages=USER)
    err = refused.value
    assert err.code == "budget_exceeded"
    assert err.response.headers["x-budget-remaining-amount"] == "0"
    assert "0.00018 EUR" in err.message
    with (
        anthropic.Anthropic(base_url=stack.openai_url, api_key=MONEY, max_retries=0) as ant,
        pytest.raises(anthropic.RateLimitError),
    ):
        ant.messages.create(model="claude-over-chat", max_tokens=8, messages=USER)
    rows = rows_of(stack, "pool_usagebucket", "chat-priced", 2, principal="team-money")
    assert from_pico(sum(r["cost_pico"] for r in rows)) == Decimal("0.00018")
