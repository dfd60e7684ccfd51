"""Budgets on their own (R-BUD-1): UTC calendar periods, the meter's in-memory view refreshed
from the ledger, the admission check and its headers, and the fail direction when the ledger
cannot be read or written. No database: the ledger reader and writer are injected."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from catalog.config import load_snapshot
from catalog.config.periods import period_bounds
from pool.http.budgets import Budgets
from pool.http.errors import HttpError
from pool.metering import UsageMeter
from pool.metering.budget_view import BudgetView, Counted
from pool.metering.pending import Counts, UsageKey
from tests.support.metering import record_factory
from tests.test_metering_meter import CONFIG, Writes

record = record_factory(input_tokens=40, output_tokens=60, duration_s=0.1, stream=False)


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).isoformat()[:19]


@pytest.mark.parametrize(
    ("period", "now", "start", "end"),
    [
        ("day", "2026-12-01T14:30:00", "2026-12-01T00:00:00", "2026-12-02T00:00:00"),
        ("week", "2026-12-03T10:00:00", "2026-11-30T00:00:00", "2026-12-07T00:00:00"),
        ("week", "2026-11-30T00:00:00", "2026-11-30T00:00:00", "2026-12-07T00:00:00"),
        ("month", "2026-12-31T23:59:59", "2026-12-01T00:00:00", "2027-01-01T00:00:00"),
        ("month", "2028-02-10T00:00:00", "2028-02-01T00:00:00", "2028-03-01T00:00:00"),
    ],
)
def test_periods_are_utc_calendar_periods_r_bud_1(period, now, start, end) -> None:
    """R-BUD-1: a day from midnight UTC, a week from Monday, a month from its first day."""
    got = period_bounds(period, at(now))
    assert (iso(got[0]), iso(got[1])) == (start, end)


def snapshot_with(budget: dict[str, Any] | None) -> Any:
    import yaml

    document = yaml.safe_load(CONFIG)
    if budget is not None:
        document["openai"]["principal_tokens"][0]["budget"] = budget
    return load_snapshot(document)


class Reader:
    """A ledger reader that answers ``figures`` (or fails) and records what was asked."""

    def __init__(self, figures: dict[str, int] | None = None) -> None:
        self.figures = figures or {}
        self.fail = False
        self.calls: list[Any] = []
        self.done = threading.Event()

    def __call__(self, wanted: Any) -> dict[str, int]:
        self.calls.append(wanted)
        self.done.set()
        if self.fail:
            raise OSError("database is unreachable")
        return dict(self.figures)


NOW = at("2026-12-01T14:30:00")


def budgets_with(
    tokens: int, reader: Reader, writer: Writes | None = None
) -> tuple[Budgets, UsageMeter]:
    snapshot = snapshot_with({"tokens": tokens, "period": "day"})
    meter = UsageMeter(
        lambda: snapshot,
        writer=writer or Writes(),
        budget_reader=reader,
        retention_days=0,
        clock=lambda: NOW,
    )
    budgets = Budgets(meter.budgets, clock=lambda: NOW)
    meter.budgets.configure(budgets.limits_of(snapshot))
    return budgets, meter


def headers(found: list[tuple[bytes, bytes]] | None) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in found or []}


def test_a_principal_without_a_budget_gets_no_headers_r_bud_1() -> None:
    """R-BUD-1: only budgeted principals carry the x-budget-* headers."""
    budgets, _ = budgets_with(1000, Reader())
    assert budgets.admit("team-ops") is None
    assert budgets.admit(None) is None


async def test_the_ledger_figure_plus_unflushed_usage_reaches_the_budget_r_bud_1() -> None:
    """R-BUD-1: the ledger's figure (every Edge) plus this Edge's usage since; at the budget,
    429 budget_exceeded with Retry-After to the period's end and the headers."""
    reader = Reader({"team-research": 800})
    budgets, meter = budgets_with(1000, reader)
    await meter.refresh_budgets()
    assert headers(budgets.admit("team-research")) == {
        "x-budget-limit-tokens": "1000",
        "x-budget-remaining-tokens": "200",
        "x-budget-reset": "2026-12-02T00:00:00Z",
    }
    meter.record(record(principal_ref="team-research", token_ref="app-ci"))  # 100 tokens
    assert headers(budgets.admit("team-research"))["x-budget-remaining-tokens"] == "100"
    meter.record(record())  # another token of the same principal: 100 more
    with pytest.raises(HttpError) as refused:
        budgets.admit("team-research")
    err = refused.value
    assert (err.status, err.code) == (429, "budget_exceeded")
    found = headers(err.headers())
    assert found["retry-after"] == str(int(at("2026-12-02T00:00:00") - NOW))
    assert found["x-budget-remaining-tokens"] == "0"
    assert budgets.admit("team-ops") is None  # R-BUD-1: per principal
    await meter.aclose()


async def test_a_refresh_counts_flushed_usage_once_r_bud_1() -> None:
    """R-BUD-1: after a flush the ledger holds what was pending; the next read replaces the
    figure and the pending map is recounted, so nothing is counted twice or lost."""
    reader = Reader({"team-research": 0})
    _, meter = budgets_with(10_000, reader)
    meter.record(record())
    await meter.flush()  # the batch is in the ledger now; the reader says so:
    reader.figures = {"team-research": 100}
    meter.record(record())  # pending, not in the ledger
    await meter.refresh_budgets()
    assert meter.budgets.used("team-research", NOW)[0] == 200
    await meter.aclose()


async def test_an_unreadable_ledger_keeps_enforcing_on_what_is_known_r_bud_1() -> None:
    """R-BUD-1 fail direction: a failed read keeps the last figure and this Edge's own usage
    keeps adding to it (budgets stay enforced); a failed write keeps the usage pending."""
    reader = Reader({"team-research": 900})
    writer = Writes(fail_first=1)
    budgets, meter = budgets_with(1000, reader, writer)
    await meter.refresh_budgets()
    reader.fail = True
    meter.record(record())  # 100: reaches 1000
    await meter.flush()  # the write fails: the batch stays pending
    await meter.refresh_budgets()  # the read fails: the figures stay
    with pytest.raises(HttpError):
        budgets.admit("team-research")
    assert meter.budgets.used("team-research", NOW)[0] == 1000
    assert len(meter.pending) == 1
    await meter.aclose()


def test_a_new_period_starts_clean_r_bud_1() -> None:
    """R-BUD-1: a figure read in yesterday's period counts nothing today."""
    view = BudgetView()
    view.configure({"p": Counted("day")})
    yesterday = NOW - 86400
    start = period_bounds("day", yesterday)[0]
    view.refreshed({("day", False): (frozenset({"p"}), start)}, {"p": 5000}, [])
    view.add("p", int(yesterday) // 3600 * 3600, 70, 0)
    assert view.used("p", yesterday)[0] == 5070
    assert view.used("p", NOW)[0] == 0


def test_a_raised_budget_is_live_r_bud_1() -> None:
    """R-BUD-1: the limit is read from the snapshot at each admission."""
    view = BudgetView()
    budgets = Budgets(view, clock=lambda: NOW)
    view.configure(budgets.limits_of(snapshot_with({"tokens": 100, "period": "day"})))
    view.add("team-research", int(NOW) // 3600 * 3600, 100, 0)
    with pytest.raises(HttpError):
        budgets.admit("team-research")
    view.configure(budgets.limits_of(snapshot_with({"tokens": 150, "period": "day"})))
    assert headers(budgets.admit("team-research"))["x-budget-remaining-tokens"] == "50"


def test_pending_usage_is_recounted_by_principal_and_hour() -> None:
    view = BudgetView()
    view.configure({"p": Counted("day")})
    key = UsageKey(int(NOW) // 3600 * 3600, "p", "t", "g", "x", "provider", False)
    other = key._replace(principal_ref="q")
    view.refreshed({}, {}, [(key, Counts(1, 0, 3, 4)), (other, Counts(1, 0, 50, 50))])
    assert view.used("p", NOW)[0] == 7


def test_the_reader_is_asked_per_period_for_the_budgeted_principals() -> None:
    view = BudgetView()
    view.configure({"a": Counted("day"), "b": Counted("month"), "c": Counted("day"),
                    "d": Counted("day", money=True)})  # fmt: skip
    wanted = view.wanted(NOW)
    assert wanted == {
        ("day", False): (frozenset({"a", "c"}), int(at("2026-12-01T00:00:00"))),
        ("day", True): (frozenset({"d"}), int(at("2026-12-01T00:00:00"))),
        ("month", False): (frozenset({"b"}), int(at("2026-12-01T00:00:00"))),
    }


async def test_a_new_budget_wakes_the_meter_for_a_read() -> None:
    """R-BUD-1: a principal newly budgeted is read from the ledger soon, not after minutes."""
    reader = Reader()
    snapshot = snapshot_with(None)
    meter = UsageMeter(
        lambda: snapshot, writer=Writes(), budget_reader=reader, retention_days=0,
        flush_interval_s=3600,
    )  # fmt: skip
    meter.configure_budgets({"team-research": Counted("day")})
    assert await asyncio.to_thread(reader.done.wait, 5.0)
    await meter.aclose()


async def test_a_budget_added_live_admits_nothing_before_the_ledger_is_read_r_bud_1() -> None:
    """Review note: a budget added by an apply used to see the whole budget left on its first
    request although the ledger already held the period's usage. Admission now waits for the
    first read of the ledger: the request that comes first after the apply is refused."""
    reader = Reader({"team-research": 5000})  # the ledger: the principal already used 5000
    snapshot = snapshot_with(None)
    meter = UsageMeter(
        lambda: snapshot, writer=Writes(), budget_reader=reader, retention_days=0,
        flush_interval_s=3600, clock=lambda: NOW,
    )  # fmt: skip
    budgets = Budgets(meter.budgets, clock=lambda: NOW)
    meter.configure_budgets(budgets.limits_of(snapshot))
    applied = snapshot_with({"tokens": 1000, "period": "day"})  # the apply adds a budget
    meter.configure_budgets(budgets.limits_of(applied))
    assert meter.budgets.unread("team-research")
    await budgets.ready("team-research")  # what admission does first (Admission.decide)
    assert reader.calls, "admission went on without a ledger read"
    with pytest.raises(HttpError) as refused:
        budgets.admit("team-research")
    assert refused.value.code == "budget_exceeded"
    await meter.aclose()


async def test_a_new_budget_whose_read_fails_is_enforced_on_what_is_known_r_bud_1() -> None:
    """The first read failing does not keep admissions waiting: this Edge's own usage counts."""
    reader = Reader()
    reader.fail = True
    budgets, meter = budgets_with(1000, reader)
    meter.configure_budgets(budgets.limits_of(snapshot_with({"tokens": 1000, "period": "day"})))
    await meter.refresh_budgets()
    assert not meter.budgets.unread("team-research")
    meter.record(record())
    assert headers(budgets.admit("team-research"))["x-budget-remaining-tokens"] == "900"
    await meter.aclose()


async def test_a_budget_in_money_counts_the_metered_cost_r_cost_3() -> None:
    """R-COST-3: ``{amount, period}`` is compared with the cost the meter records (the same
    counters as tokens), the headers in the currency; 429 once it is spent."""
    import yaml

    document = yaml.safe_load(CONFIG)
    document["openai"]["principal_tokens"][0]["budget"] = {"amount": 0.001, "period": "day"}
    document["models"][0]["price"] = {"input": 3, "output": 15}  # per million tokens
    document["metering"] = {"currency": "EUR"}
    snapshot = load_snapshot(document)
    reader = Reader({"team-research": 300_000_000})  # the ledger: 0.0003 EUR already
    meter = UsageMeter(lambda: snapshot, writer=Writes(), budget_reader=reader,
                       retention_days=0, clock=lambda: NOW)  # fmt: skip
    budgets = Budgets(meter.budgets, clock=lambda: NOW)
    meter.configure_budgets(budgets.limits_of(snapshot))
    await meter.refresh_budgets()
    assert headers(budgets.admit("team-research")) == {
        "x-budget-limit-amount": "0.001",
        "x-budget-currency": "EUR",
        "x-budget-remaining-amount": "0.0007",
        "x-budget-reset": "2026-12-02T00:00:00Z",
    }
    # 40 in at 3 + 60 out at 15 per million: 0.00012 + 0.0009 = 0.00102 EUR
    meter.record(record(provider_id="vllm-local"))
    with pytest.raises(HttpError) as refused:
        budgets.admit("team-research")
    assert refused.value.code == "budget_exceeded"
    assert headers(refused.value.headers())["x-budget-remaining-amount"] == "0"
    assert "0.001 EUR per period" in refused.value.message
    await meter.aclose()
