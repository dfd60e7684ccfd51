"""Cost at record time (R-COST-1, R-COST-2): the provider's price or its group's, cached input
tokens at their own price, integers in 10^-12 of the currency so a month of rows sums with
no drift, and ``iop_spend_total`` marked estimated when the tokens were."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import yaml

from catalog.config import load_snapshot
from catalog.config.money import from_pico
from pool.metering import UsageMeter
from tests.support.metering import record_factory
from tests.test_metering_meter import CONFIG, NOW, Writes, samples

record = record_factory(duration_s=0.1, stream=False)
GROUP_PRICE = {"input": 0.15, "output": 0.6, "cached_input": 0.075}
GLM_PRICE = {"input": 0.6, "output": 2.2}  # cached_input omitted: the input price


def priced() -> Any:
    document = yaml.safe_load(CONFIG)
    for model in document["models"]:
        if model["id"] in ("qwen-local", "glm-4.6"):
            model["price"] = GROUP_PRICE
    glm = next(p for p in document["nodes"][0]["providers"] if p["id"] == "glm-general")
    glm["price"] = GLM_PRICE  # the provider's price wins over glm-4.6's
    return load_snapshot(document)


def by_hand(price: dict[str, float], tokens_in: int, cached: int, tokens_out: int) -> Decimal:
    """The figure an operator computes: Decimal prices per million tokens."""
    per = {k: Decimal(str(v)) / 1_000_000 for k, v in price.items()}
    cached_price = per.get("cached_input", per["input"])
    return (tokens_in - cached) * per["input"] + cached * cached_price + tokens_out * per["output"]


async def test_a_month_of_rows_sums_to_the_hand_computed_cost_without_drift_r_cost_2() -> None:
    """R-COST-2: 744 hours of requests with random figures; the ledger batches' cost equals
    the Decimal sum computed by hand, to the last digit (a float sum of the same costs does
    not: the reason money is integers here)."""
    clock = [NOW]
    snapshot = priced()
    writes = Writes()
    meter = UsageMeter(lambda: snapshot, writer=writes, retention_days=0,
                       clock=lambda: clock[0])  # fmt: skip
    rng = random.Random(40)
    expected, floats = Decimal(0), 0.0
    for hour in range(744):
        clock[0] = NOW + hour * 3600
        for _ in range(3):
            tokens_in, tokens_out = rng.randrange(1, 200_000), rng.randrange(0, 8000)
            cached = rng.randrange(0, tokens_in + 1)
            meter.record(record(input_tokens=tokens_in, output_tokens=tokens_out,
                                cached_input_tokens=cached))  # fmt: skip
            cost = by_hand(GROUP_PRICE, tokens_in, cached, tokens_out)
            expected += cost
            floats += float(cost)
        await meter.flush()
    ledger = sum(counts[5] for batch, _ in writes.batches for counts in batch.values())
    assert len(writes.batches) == 744
    assert from_pico(ledger) == expected
    assert Decimal(repr(floats)) != expected  # the drift integers avoid
    await meter.aclose()


async def test_the_providers_price_wins_and_an_unpriced_pair_costs_nothing_r_cost_1() -> None:
    """R-COST-1: glm-general's own price (cached input at the input price, as omitted);
    qwen-local's group price; ollama-local under qwen-pooled has none: 0."""
    snapshot = priced()
    writes = Writes()
    meter = UsageMeter(lambda: snapshot, writer=writes, retention_days=0, clock=lambda: NOW)
    meter.record(record(model_group="glm-4.6", provider_id="glm-general", input_tokens=1000,
                        cached_input_tokens=400, output_tokens=100))  # fmt: skip
    meter.record(record(input_tokens=1000, cached_input_tokens=400, output_tokens=100))
    meter.record(record(model_group="qwen-pooled", provider_id="ollama-local",
                        input_tokens=1000, output_tokens=100))  # fmt: skip
    await meter.flush()
    ((batch, _),) = writes.batches
    cost = {key.model_group: from_pico(counts[5]) for key, counts in batch.items()}
    cached = {key.model_group: counts[4] for key, counts in batch.items()}
    assert cost == {
        "glm-4.6": by_hand(GLM_PRICE, 1000, 400, 100),
        "qwen-local": by_hand(GROUP_PRICE, 1000, 400, 100),
        "qwen-pooled": Decimal(0),
    }
    assert cost["glm-4.6"] == Decimal("0.00082") and cost["qwen-local"] == Decimal("0.00018")
    assert cached == {"glm-4.6": 400, "qwen-local": 400, "qwen-pooled": 0}
    await meter.aclose()


async def test_spend_is_exposed_per_principal_group_and_provider_marked_estimated_r_cost_2() -> (
    None
):
    """R-COST-2: ``iop_spend_total`` in the currency; an estimated record's cost is in the
    ``estimated="true"`` series; cached tokens above the input figure count as the input."""
    snapshot = priced()
    meter = UsageMeter(lambda: snapshot, writer=Writes(), retention_days=0, clock=lambda: NOW)
    meter.record(record(input_tokens=1_000_000, output_tokens=0))  # 0.15
    meter.record(record(input_tokens=0, output_tokens=1_000_000, estimated=True))  # 0.6
    meter.record(record(input_tokens=10, cached_input_tokens=99, output_tokens=0))  # 10 cached
    spend = samples(meter, "iop_spend_total")
    where = {"principal": "team-research", "model_group": "qwen-local", "provider": "vllm-local"}
    assert spend == {
        frozenset({**where, "estimated": "false"}.items()): 0.15 + 10 * 0.075 / 1e6,
        frozenset({**where, "estimated": "true"}.items()): 0.6,
    }
    await meter.aclose()
