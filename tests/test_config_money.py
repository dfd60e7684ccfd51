"""Prices, the currency and budgets in money at load (R-COST-1, R-COST-3): what loads, how a
figure is read (exactly, as a decimal), and every refusal with the path it names."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from catalog.config import load_snapshot
from catalog.config.money import from_pico, pico_text
from catalog.config.snapshot import Price
from tests.support.config import load_issues, provider
from tests.support.config_examples import example_document

HASH = "c" * 64


def priced(group: Any = None, provider_price: Any = None, **root: Any) -> dict[str, Any]:
    document = example_document()
    document.update(root)
    if group is not None:
        document["models"][0]["price"] = group
    if provider_price is not None:
        first = next(iter(document["models"][0]["providers"]))
        provider(document, first)["price"] = provider_price
    return document


def first_group(document: dict[str, Any]) -> tuple[str, str]:
    group = document["models"][0]
    return group["id"], next(iter(group["providers"]))


def test_prices_load_exactly_and_the_providers_wins_r_cost_1() -> None:
    """R-COST-1: numbers and strings become exact decimals (0.15 is 0.15, not its binary
    neighbour); ``cached_input`` omitted is the input price; the provider's price wins."""
    document = priced({"input": 0.15, "output": "0.6"})
    snapshot = load_snapshot(document)
    group, first = first_group(document)
    assert snapshot.price(group, first) == Price(Decimal("0.15"), Decimal("0.6"), Decimal("0.15"))
    assert snapshot.price(group, None) == snapshot.price(group, first)
    assert snapshot.currency == "USD"  # the default
    document = priced(
        {"input": 1, "output": 2},
        {"input": 3, "output": 15, "cached_input": 0.3},
        metering={"currency": "EUR"},
    )
    snapshot = load_snapshot(document)
    assert snapshot.price(group, first) == Price(Decimal(3), Decimal(15), Decimal("0.3"))
    assert snapshot.currency == "EUR"
    assert snapshot.document["metering"] == {"currency": "EUR"}
    assert snapshot.price(group, first).per_token_pico() == (3_000_000, 15_000_000, 300_000)


def test_the_canonical_document_reloads_to_the_same_snapshot_r_cost_1() -> None:
    """R-COST-1: prices are written back as JSON numbers that read back exactly."""
    document = priced({"input": "0.000001", "output": 999999.999999, "cached_input": 0.075})
    snapshot = load_snapshot(document)
    assert load_snapshot(snapshot.document) == snapshot
    assert snapshot.document["models"][0]["price"] == {
        "input": 1e-06, "output": 999999.999999, "cached_input": 0.075,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("price", "message"),
    [
        ({"input": -0.01, "output": 1}, ".input: must be >= 0"),
        ({"input": "abc", "output": 1}, ".input: must be a number"),
        ({"input": True, "output": 1}, ".input: must be a number"),
        ({"input": float("nan"), "output": 1}, ".input: must be a finite number"),
        ({"input": 1, "output": 10**7}, ".output: must be <= 1000000"),
        ({"input": 0.0000001, "output": 1}, ".input: must have at most 6 decimal places"),
        ({"input": 1}, ".output: is required"),
        ({"input": 1, "output": 1, "cache": 1}, ".cache: unknown key"),
        ("cheap", ": must be a mapping"),
    ],
    ids=["negative", "text", "bool", "nan", "huge", "too-fine", "no-output", "extra", "scalar"],
)
def test_a_bad_price_is_refused_with_its_path_r_cost_1(price: Any, message: str) -> None:
    """R-COST-1: negative, non-numeric, unbounded or too fine: refused, on a group and on a
    provider alike, naming the key."""
    issues = load_issues(priced(price))
    assert len(issues) == 1 and issues[0].startswith(f"models[0].price{message}"), issues
    issues = load_issues(priced(provider_price=price))
    assert len(issues) == 1 and ".price" in issues[0] and message in issues[0], issues
    assert issues[0].startswith("nodes["), issues


@pytest.mark.parametrize("currency", ["usd", "DOLLAR", "", 5])
def test_a_bad_currency_is_refused_with_its_path_r_cost_1(currency: Any) -> None:
    issues = load_issues(priced(metering={"currency": currency}))
    assert len(issues) == 1 and issues[0].startswith("metering.currency: "), issues
    assert load_issues(priced(metering={"currency": "USD", "round": 2})) == [
        "metering.round: unknown key"
    ]


def with_principal(budget: Any) -> dict[str, Any]:
    document = example_document()
    document["principals"] = [{"id": "team-money", "budget": budget}]
    return document


def test_a_budget_in_money_loads_r_cost_3() -> None:
    """R-COST-3: ``{amount, period}`` instead of ``{tokens, period}``; its limit is the amount
    in 10^-12 units of the currency, exactly."""
    snapshot = load_snapshot(with_principal({"amount": 25.1, "period": "month"}))
    budget = snapshot.principals["team-money"].budget
    assert budget is not None and budget.in_money and budget.tokens is None
    assert budget.amount == Decimal("25.1") and budget.limit == 25_100_000_000_000
    assert load_snapshot(snapshot.document) == snapshot
    document = example_document()
    document["openai"].setdefault("principal_tokens", []).append(
        {"token_ref": "app-m", "token_hash_sha256": HASH, "principal_ref": "team-money",
         "budget": {"amount": "0.5", "period": "day"}}
    )  # fmt: skip
    tokens = load_snapshot(document).principal_tokens
    assert [t.budget.limit for t in tokens if t.budget] == [500_000_000_000]


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"tokens": 10, "amount": 5, "period": "day"}, ": a budget states exactly one"),
        ({"period": "day"}, ": a budget states exactly one"),
        ({"amount": 0, "period": "day"}, ".amount: must be > 0"),
        ({"amount": -1, "period": "day"}, ".amount: must be >= 0"),
        ({"amount": "lots", "period": "day"}, ".amount: must be a number"),
        ({"amount": 10**10, "period": "day"}, ".amount: must be <= 1000000000"),
    ],
    ids=["both", "neither", "zero", "negative", "text", "huge"],
)
def test_a_bad_budget_in_money_is_refused_with_its_path_r_cost_3(budget: Any, message: str) -> None:
    issues = load_issues(with_principal(budget))
    assert len(issues) == 1 and issues[0].startswith(f"principals[0].budget{message}"), issues


def test_decimal_text_of_ledger_units() -> None:
    """Figures in 10^-12 units are shown without rounding up (integer arithmetic only)."""
    assert pico_text(25 * 10**12) == "25"
    assert pico_text(24_999_985_000_000) == "24.999985"
    assert pico_text(1) == "0.000000000001"
    assert pico_text(1, places=6) == "0"
    assert pico_text(-1_500_000_000_000) == "-1.5"
    assert from_pico(1_234_500_000_000) == Decimal("1.2345")
