"""Usage over time in the admin: ledger rows become a chart per principal and per model group
(R-PRIN-4). The series module is pure; the page is driven through Django's test client."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from pool.models import UsageBucket
from pool.usage_series import (
    LEFT,
    MAX_CHARTS,
    WIDTH,
    Row,
    build_section,
    nice_top,
    window_for,
    x_labels,
    y_of,
)

NOW = datetime(2026, 3, 10, 14, 25, tzinfo=UTC)


def row(hours_ago: int, key: str, requests: int = 1, errors: int = 0, tin: int = 0, tout: int = 0):
    start = NOW.replace(minute=0) - timedelta(hours=hours_ago)
    return Row(start, key, requests, errors, tin, tout)


def test_the_hourly_window_ends_with_the_current_hour():
    """R-PRIN-4: the hourly window ends with the current hour."""
    window = window_for("24h", NOW)
    assert window.step == "hour"
    assert window.starts[-1] == datetime(2026, 3, 10, 14, tzinfo=UTC)
    assert len(window.starts) == 24


def test_the_daily_window_ends_with_today():
    """R-PRIN-4: the daily window ends with today."""
    window = window_for("30d", NOW)
    assert window.starts[-1] == datetime(2026, 3, 10, tzinfo=UTC)
    assert len(window.starts) == 30 and window.step == "day"


def test_an_unknown_range_falls_back_to_the_last_24_hours():
    """R-PRIN-4: an unknown range falls back to the last 24 hours."""
    assert window_for("forever", NOW) == window_for("24h", NOW)


def test_rows_land_in_their_bucket_and_keys_are_ranked_by_requests():
    """R-PRIN-4: one chart per key; each metric per bucket; busiest key first."""
    window = window_for("24h", NOW)
    rows = [row(0, "team-b", 5, 1, 100, 50), row(3, "team-a", 2), row(0, "team-a", 1, 0, 7, 3)]
    section = build_section(rows, window)
    assert [c.key for c in section.charts] == ["team-b", "team-a"]
    team_a = section.charts[1]
    assert team_a.totals == {"requests": 3, "errors": 0, "input_tokens": 7, "output_tokens": 3,
                             "spend": 0, "spend_estimated": 0}  # fmt: skip
    requests = team_a.panels[0].series[0]
    assert requests.metric == "requests"
    assert requests.values[-1] == 1 and requests.values[-4] == 2 and sum(requests.values) == 3


def test_daily_buckets_sum_the_hours_of_a_day():
    """R-PRIN-4: daily buckets sum the hours of a day."""
    window = window_for("30d", NOW)
    section = build_section([row(1, "g", 2), row(3, "g", 3), row(30, "g", 4)], window)
    values = section.charts[0].panels[0].series[0].values
    assert values[-1] == 5 and values[-2] == 4


def test_rows_outside_the_window_are_left_out():
    """R-PRIN-4: rows outside the window are left out."""
    window = window_for("24h", NOW)
    assert build_section([row(24, "old"), row(-1, "future")], window).charts == ()


def test_the_polyline_maps_values_onto_the_plot_area():
    """R-PRIN-4: the polyline maps values onto the plot area."""
    window = window_for("24h", NOW)
    chart = build_section([row(0, "k", 4)], window).charts[0]
    panel = chart.panels[0]
    assert panel.top == 5
    points = panel.series[0].points.split()
    assert len(points) == 24
    last_x, last_y = (float(v) for v in points[-1].split(","))
    assert last_x == LEFT + WIDTH and last_y == pytest.approx(y_of(4, 5), abs=0.1)


def test_only_the_busiest_keys_get_a_chart_and_the_rest_are_counted():
    """R-PRIN-4: only the busiest keys get a chart and the rest are counted."""
    window = window_for("24h", NOW)
    rows = [row(0, f"k{i:02d}", requests=i + 1) for i in range(MAX_CHARTS + 3)]
    section = build_section(rows, window)
    assert len(section.charts) == MAX_CHARTS and section.left_out == 3
    assert section.charts[0].key == f"k{MAX_CHARTS + 2:02d}"


def test_axis_maxima_are_readable_numbers():
    """R-PRIN-4: axis maxima are readable numbers."""
    assert [nice_top(v) for v in (0, 1, 3, 7, 11, 4500)] == [1, 1, 5, 10, 20, 5000]


def test_x_labels_are_hours_for_a_day_and_dates_for_a_month():
    """R-PRIN-4: x labels are hours for a day and dates for a month."""
    assert x_labels(window_for("24h", NOW))[0][1].endswith(":00")
    assert x_labels(window_for("30d", NOW))[0][1] == "02-09"


def test_the_seven_day_axis_labels_every_day_once_at_its_midnight():
    """R-PRIN-4: 168 hourly buckets get one date label per day, at 00:00 UTC, so no day seems
    missing (a stride of 28 buckets skipped one)."""
    window = window_for("7d", NOW)
    labels = [label for _, label in x_labels(window)]
    midnights = [s for s in window.starts if s.hour == 0]
    assert labels == [s.strftime("%m-%d") for s in midnights]
    assert len(labels) == len(set(labels)) == 7
    days = [datetime.strptime(f"2026-{label}", "%Y-%m-%d") for label in labels]
    assert all(b - a == timedelta(days=1) for a, b in itertools.pairwise(days))


# --- the page ---------------------------------------------------------------------------------


@pytest.fixture
def staff(client, django_user_model):
    user = django_user_model.objects.create(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def ledger(
    hours_ago: int,
    principal: str,
    group: str,
    requests: int,
    errors: int = 0,
    cost_pico: int = 0,
    estimated: bool = False,
) -> None:
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours_ago)
    UsageBucket.objects.create(
        cost_pico=cost_pico,
        estimated=estimated,
        bucket_start=start,
        principal_ref=principal,
        token_ref=f"app-{principal}",
        model_group=group,
        attributed_to="p1",
        requests=requests,
        errors=errors,
        input_tokens=requests * 10,
        output_tokens=requests * 5,
        updated_at=timezone.now(),
    )


@pytest.mark.django_db
def test_the_page_draws_a_chart_per_principal_and_per_model_group(staff):
    """R-PRIN-4: totals per principal and per group come from the ledger."""
    ledger(0, "team-a", "gpt", 3, 1)
    ledger(2, "team-a", "glm", 2)
    ledger(1, "team-b", "gpt", 4)
    response = staff.get(reverse("usage-chart"))
    assert response.status_code == 200
    sections = dict((key, section) for key, _, section in response.context["sections"])
    by_principal = {c.key: c.totals for c in sections["principal"].charts}
    assert by_principal["team-a"] == {
        "requests": 5,
        "errors": 1,
        "input_tokens": 50,
        "output_tokens": 25,
        "spend": 0,
        "spend_estimated": 0,
    }
    assert {c.key: c.totals["requests"] for c in sections["model_group"].charts} == {
        "gpt": 7,
        "glm": 2,
    }
    assert b'data-key="team-b"' in response.content and b"<polyline" in response.content


@pytest.mark.django_db
def test_the_no_label_buckets_are_named_in_words_r_prin_4(staff):
    """R-PRIN-4: the ledger's ``-`` (a request refused before routing, a caller without a
    principal token) reads as words on the page and in the filters, never as ``-``."""
    ledger(0, "-", "-", 2)
    response = staff.get(reverse("usage-chart"))
    text = response.content.decode()
    assert "<h3>no model group (refused before routing)</h3>" in text
    assert "<h3>no principal (no principal token)</h3>" in text
    assert "<h3>-</h3>" not in text
    assert '<option value="-">no model group (refused before routing)</option>' in text
    response = staff.get(reverse("usage-chart"), {"model_group": "-"})
    sections = dict((key, section) for key, _, section in response.context["sections"])
    assert [c.title for c in sections["model_group"].charts] == [
        "no model group (refused before routing)"
    ]


@pytest.mark.django_db
def test_the_page_filters_by_principal_and_model_group(staff):
    """R-PRIN-4: the page filters by principal and model group."""
    ledger(0, "team-a", "gpt", 3)
    ledger(0, "team-a", "glm", 2)
    ledger(0, "team-b", "gpt", 4)
    response = staff.get(reverse("usage-chart"), {"principal": "team-a", "model_group": "gpt"})
    sections = dict((key, section) for key, _, section in response.context["sections"])
    assert [(c.key, c.totals["requests"]) for c in sections["principal"].charts] == [("team-a", 3)]
    assert [(c.key, c.totals["requests"]) for c in sections["model_group"].charts] == [("gpt", 3)]


@pytest.mark.django_db
def test_the_filter_lists_each_principal_and_group_once(staff):
    """R-PRIN-4: a principal with rows in several hours and groups is one choice (the ledger's
    ordering must not reach the DISTINCT)."""
    for hours_ago in range(3):
        ledger(hours_ago, "team-a", "gpt", 1)
        ledger(hours_ago, "team-a", "glm", 1)
    form = staff.get(reverse("usage-chart")).context["form"]
    assert [v for v, _ in form.fields["principal"].choices] == ["", "team-a"]
    assert [v for v, _ in form.fields["model_group"].choices] == ["", "glm", "gpt"]


@pytest.mark.django_db
def test_the_daily_range_reaches_back_past_a_day(staff):
    """R-PRIN-4: the daily range reaches back past a day."""
    ledger(50, "team-old", "gpt", 6)
    hourly = staff.get(reverse("usage-chart"))
    assert b'data-key="team-old"' not in hourly.content
    daily = staff.get(reverse("usage-chart"), {"range": "30d"})
    assert b'data-key="team-old"' in daily.content


@pytest.mark.django_db
def test_the_page_is_for_staff_only(client):
    """R-PRIN-4: the page is for staff only."""
    response = client.get(reverse("usage-chart"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


@pytest.mark.django_db
def test_a_budgeted_principal_gets_its_budget_line_r_bud_1(staff):
    """R-BUD-1: the principal's chart draws the budget and the tokens used in its period,
    counted from the period's start even before the window (a month budget here)."""
    from catalog.models import PrincipalToken

    PrincipalToken.objects.create(
        token_ref="app-team-a",
        token_hash_sha256="c" * 64,
        principal_ref="team-a",
        budget={"tokens": 1000, "period": "month"},
    )
    ledger(0, "team-a", "gpt", 3)  # 45 tokens this hour
    ledger(1, "team-a", "gpt", 2)  # 30 tokens an hour ago
    ledger(0, "team-b", "gpt", 4)
    response = staff.get(reverse("usage-chart"))
    sections = dict((key, section) for key, _, section in response.context["sections"])
    charts = {c.key: c for c in sections["principal"].charts}
    (budget,) = [p for p in charts["team-a"].panels if p.name == "budget"]
    assert budget.limit == 1000 and budget.top >= 1000
    used = budget.series[0].values
    now = timezone.now()
    if (now.day, now.hour) == (1, 0):  # the month started this hour: the count starts again
        assert used[-1] == 45
    else:
        assert used[-1] >= 75 and used[-1] - used[-2] == 45  # cumulative within the period
    assert all(p.name != "budget" for p in charts["team-b"].panels)
    assert b'class="budget-limit" data-budget="1000"' in response.content
    filtered = staff.get(reverse("usage-chart"), {"model_group": "gpt"})
    sections = dict((key, section) for key, _, section in filtered.context["sections"])
    assert all(p.name != "budget" for c in sections["principal"].charts for p in c.panels)


@pytest.mark.django_db
def test_spend_is_charted_per_principal_and_group_with_estimated_spend_apart_r_cost_2(staff):
    """R-COST-2: a spend panel per principal and per group in the currency; the cost of rows
    whose tokens were estimated is its own (dashed) series, marked in words."""
    ledger(0, "team-a", "gpt", 3, cost_pico=1_500_000_000_000)  # 1.5
    ledger(1, "team-a", "glm", 1, cost_pico=250_000_000_000, estimated=True)  # 0.25 estimated
    ledger(0, "team-b", "gpt", 1)
    response = staff.get(reverse("usage-chart"))
    sections = dict((key, section) for key, _, section in response.context["sections"])
    charts = {c.key: c for c in sections["principal"].charts}
    (spend,) = [p for p in charts["team-a"].panels if p.name == "spend"]
    assert [(s.metric, s.total, s.shown) for s in spend.series] == [
        ("spend", 1_500_000_000_000, "1.5"),
        ("spend_estimated", 250_000_000_000, "0.25"),
    ]
    assert spend.in_money and spend.y_ticks[-1][1] == "2"  # the axis in the currency
    groups = {c.key: c.totals for c in sections["model_group"].charts}
    assert (groups["glm"]["spend"], groups["glm"]["spend_estimated"]) == (0, 250_000_000_000)
    text = response.content.decode()
    assert "spend 1.5 USD" in text and "estimated spend 0.25 USD" in text
    assert 'class="m-spend_estimated" data-metric="spend_estimated"' in text


@pytest.mark.django_db
def test_a_budget_in_money_is_drawn_against_the_spend_r_cost_3(staff):
    """R-COST-3: a principal's budget in money (``principals:``) is drawn in the currency,
    against the cost used in its period (estimated cost included: the budget counts it)."""
    from catalog.models import EdgeSettings

    EdgeSettings.objects.create(
        other_sections={
            "principals": [{"id": "team-a", "budget": {"amount": 25, "period": "month"}}],
            "metering": {"currency": "EUR"},
        }
    )
    ledger(0, "team-a", "gpt", 1, cost_pico=2 * 10**12)
    ledger(0, "team-a", "glm", 1, cost_pico=10**12, estimated=True)
    response = staff.get(reverse("usage-chart"))
    sections = dict((key, section) for key, _, section in response.context["sections"])
    (chart,) = sections["principal"].charts
    (budget,) = [p for p in chart.panels if p.name == "budget"]
    assert (budget.limit, budget.limit_shown, budget.in_money) == (25 * 10**12, "25", True)
    assert budget.series[0].values[-1] >= 3 * 10**12
    assert "used in the period (budget 25 EUR)" in response.content.decode()
