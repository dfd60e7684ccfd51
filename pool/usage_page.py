"""The usage page in the admin: a chart per principal and per model group (R-PRIN-4).

Reads the usage ledger (``pool.models.UsageBucket``), sums it per bucket and key in the
database, and hands the rows to ``pool.usage_series``; the template draws inline SVG, so the
page needs no script and no charting library (``docs/metering.md``, "Usage charts").
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Q, QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from catalog.config.money import DEFAULT_CURRENCY, to_pico
from catalog.config.periods import period_bounds
from catalog.config.schema.openai import BudgetDoc
from catalog.models import EdgeSettings, PrincipalToken
from edgekit.running import running_edge
from pool.metering import NO_LABEL
from pool.models import UsageBucket
from pool.usage_series import (
    BOTTOM,
    HEIGHT,
    LEFT,
    MAX_CHARTS,
    RANGES,
    TOP,
    WIDTH,
    Budget,
    Row,
    build_section,
    window_for,
    x_labels,
)

SECTIONS = (
    ("principal", "By principal", "principal_ref"),
    ("model_group", "By model group", "model_group"),
)
SUMS = {
    **{name: Sum(name) for name in ("requests", "errors", "input_tokens", "output_tokens")},
    # R-COST-2: spend apart for rows whose tokens were estimated
    "spend": Sum("cost_pico", filter=Q(estimated=False)),
    "spend_estimated": Sum("cost_pico", filter=Q(estimated=True)),
}
# The ledger's "-" in words (docs/metering.md, "Usage charts"): a request refused before it
# was routed (an unknown model, a refused token) has no model group; a caller without a
# principal token has no principal. Usage folded past the memory cap lands there too.
NO_GROUP = "no model group (refused before routing)"
NO_PRINCIPAL = "no principal (no principal token)"


class UsageFilter(forms.Form):
    range = forms.ChoiceField(
        choices=[(key, label) for key, (label, _, _) in RANGES.items()], required=False
    )
    principal = forms.ChoiceField(required=False)
    model_group = forms.ChoiceField(label="model group", required=False)

    def __init__(self, data: Any, principals: list[str], groups: list[str]) -> None:
        super().__init__(data)
        for name, values in (("principal", principals), ("model_group", groups)):
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            words = NO_PRINCIPAL if name == "principal" else NO_GROUP
            field.choices = [("", "all"), *((v, words if v == NO_LABEL else v) for v in values)]


def _distinct(field: str) -> list[str]:
    # order_by(): the model's Meta.ordering would add its columns to the DISTINCT
    return sorted(UsageBucket.objects.order_by().values_list(field, flat=True).distinct())


def _rows(queryset: QuerySet, key: str) -> list[Row]:
    summed = queryset.values("bucket_start", key).annotate(**SUMS).order_by()
    return [
        Row(
            r["bucket_start"],
            r[key],
            r["requests"] or 0,
            r["errors"] or 0,
            r["input_tokens"] or 0,
            r["output_tokens"] or 0,
            r["spend"] or 0,
            r["spend_estimated"] or 0,
        )
        for r in summed
    ]


def budgets() -> dict[str, Budget]:
    """R-BUD-1, R-COST-3: each budgeted principal's budget (on a token or in ``principals:``):
    the running Edge's, else the catalog's."""
    edge = running_edge()
    if edge is not None:
        snapshot = edge.snapshot
        stated = [(t.principal_ref, t.budget) for t in snapshot.principal_tokens]
        stated += [(p.id, p.budget) for p in snapshot.principals.values()]
        return {ref: Budget(b.limit, b.period, b.in_money) for ref, b in stated if b is not None}
    found: dict[str, Budget] = {}
    rows = list(PrincipalToken.objects.exclude(budget=None).values_list("principal_ref", "budget"))
    settings = EdgeSettings.objects.filter(pk=EdgeSettings.SINGLETON_PK).first()
    for entry in (settings.other_sections.get("principals") or []) if settings else []:
        if isinstance(entry, dict) and entry.get("budget") is not None:
            rows.append((str(entry.get("id")), entry["budget"]))
    for ref, raw in rows:
        try:
            doc = BudgetDoc.model_validate(raw)
        except ValueError:  # the catalog is validated as a whole elsewhere
            continue
        limit = to_pico(doc.amount) if doc.amount is not None else int(doc.tokens or 0)
        found.setdefault(ref, Budget(limit, doc.period, doc.amount is not None))
    return found


def currency() -> str:
    """R-COST-1: ``metering.currency`` of the running Edge, else the catalog's."""
    edge = running_edge()
    if edge is not None:
        return edge.snapshot.currency
    settings = EdgeSettings.objects.filter(pk=EdgeSettings.SINGLETON_PK).first()
    metering = settings.other_sections.get("metering") if settings else None
    found = metering.get("currency") if isinstance(metering, dict) else None
    return found if isinstance(found, str) else DEFAULT_CURRENCY


def carried_into(window_start: datetime, wanted: dict[str, Budget]) -> dict[str, int]:
    """Tokens (or cost) each budgeted principal used in its period before the window."""
    carried: dict[str, int] = {}
    at = int(window_start.timestamp())
    for ref, budget in wanted.items():
        start = period_bounds(budget.period, at)[0]
        if start < at:
            sums = UsageBucket.objects.filter(
                principal_ref=ref,
                bucket_start__gte=datetime.fromtimestamp(start, tz=UTC),
                bucket_start__lt=window_start,
            ).aggregate(**SUMS)
            if budget.money:
                carried[ref] = (sums["spend"] or 0) + (sums["spend_estimated"] or 0)
            else:
                carried[ref] = (sums["input_tokens"] or 0) + (sums["output_tokens"] or 0)
    return carried


def usage_context(params: Any) -> dict[str, Any]:
    """Filters, window and both sections for the query string ``params``."""
    form = UsageFilter(params, _distinct("principal_ref"), _distinct("model_group"))
    chosen = form.cleaned_data if form.is_valid() else {}
    range_key = chosen.get("range") or next(iter(RANGES))
    window = window_for(range_key, timezone.now())
    queryset = UsageBucket.objects.filter(
        bucket_start__gte=window.start, bucket_start__lt=window.end
    )
    if chosen.get("principal"):
        queryset = queryset.filter(principal_ref=chosen["principal"])
    if chosen.get("model_group"):
        queryset = queryset.filter(model_group=chosen["model_group"])
    by_principal = _rows(queryset, "principal_ref")
    shown = {row.key for row in by_principal}
    # R-BUD-1: the budget counts every group, so a chart of one group draws no budget
    wanted = {} if chosen.get("model_group") else {r: b for r, b in budgets().items() if r in shown}
    carried = carried_into(window.start, wanted)
    return {
        "form": form,
        "range_label": RANGES[range_key][0],
        "window": window,
        "sections": [
            (
                "principal",
                "By principal",
                build_section(
                    by_principal, window, wanted, carried, titles={NO_LABEL: NO_PRINCIPAL}
                ),
            ),
            (
                "model_group",
                "By model group",
                build_section(_rows(queryset, "model_group"), window, titles={NO_LABEL: NO_GROUP}),
            ),
        ],
        "x_labels": x_labels(window),
        "currency": currency(),
        "geometry": {
            "left": LEFT,
            "top": TOP,
            "width": WIDTH,
            "height": HEIGHT,
            "right": LEFT + WIDTH,
            "bottom": TOP + HEIGHT,
            "view_w": LEFT + WIDTH + 8,
            "view_h": TOP + HEIGHT + BOTTOM,
            "label_y": TOP + HEIGHT + 15,
        },
        "max_charts": MAX_CHARTS,
    }


def _usage_page(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Usage over time",
        **usage_context(request.GET),
    }
    return TemplateResponse(request, "admin/usage_chart.html", context)


usage_page = admin.site.admin_view(_usage_page)  # staff only; signed out -> the admin login
