"""Admin pages in a real browser: the pool status page follows a slow request live, without a
reload, and shows a provider its Node refuses with the reason (R-TLS-3); the usage page
charts what the Edge metered.

Headless Debian Chromium (``scripts/install-browser.sh``) driven by Playwright; never a
downloaded browser. R-POOL-8 (what the page shows), R-POOL-9 (back to 0 afterwards),
R-PRIN-4 (usage over time as a chart).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support import Stack
from tests.support.browser import NEEDS_CHROMIUM, admin_login, browser_page

if TYPE_CHECKING:
    from playwright.sync_api import Page

PASSWORD = "browser-test-password"
ROW = 'tr[data-provider="p-slow"]'

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("browser"),
        providers=[
            {"id": "p-slow", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2}
        ],
        models=[{"id": "slow-model", "providers": {"p-slow": "served-slow"}}],
        log_level="WARNING",
    ) as running:
        running.create_superuser("staff", PASSWORD)
        yield running


@pytest.fixture
def page(stack: Stack) -> Iterator[Page]:
    with browser_page() as tab:
        yield tab


def _sign_in(page: Page, stack: Stack, path: str) -> None:
    page.goto(stack.openai_url + path)
    assert "/admin/login/" in page.url  # staff only: the login comes first
    admin_login(page, "staff", PASSWORD)
    page.wait_for_url(f"**{path}")


def test_status_page_shows_in_flight_change_live_while_a_slow_request_runs(
    stack: Stack, page: Page
) -> None:
    _sign_in(page, stack, "/admin/pool-status/")

    row = page.locator(ROW)
    assert row.get_attribute("data-state") == "idle"
    assert row.locator('[data-field="in_flight"]').inner_text().strip() == "0 / 2"
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    stack.upstream().server.faults.stall_before_first_byte = 3.0
    conn = stack.send_chat("slow-model")
    try:
        page.wait_for_selector(f'{ROW}[data-state="busy"]')
        assert row.locator('[data-field="in_flight"]').inner_text().strip() == "1 / 2"
        response = conn.getresponse()
        assert response.status == 200
        response.read()
    finally:
        conn.close()
        stack.upstream().reset()
    page.wait_for_selector(f'{ROW}[data-state="idle"]')
    assert row.locator('[data-field="in_flight"]').inner_text().strip() == "0 / 2"
    assert page.evaluate("window.__sameDocument") is True
    assert page.locator("#pool-status.stale").count() == 0
    stack.wait_idle()


def _requests_charted(page: Page, section: str, key: str) -> int:
    figure = page.locator(f'figure[data-section="{section}"][data-key="{key}"]')
    return int(figure.get_attribute("data-requests") or 0) if figure.count() else 0


def test_usage_page_charts_metered_requests_per_principal_and_model_group(
    stack: Stack, page: Page
) -> None:
    """R-PRIN-4: requests through the Edge appear in the principal's and the group's charts."""
    for _ in range(3):
        conn = stack.send_chat("slow-model")
        assert conn.getresponse().status == 200
        conn.close()
    _sign_in(page, stack, "/admin/usage/")
    deadline = time.monotonic() + 30  # the meter writes the ledger in batches (every 5 s)
    while _requests_charted(page, "principal", "team-test") < 3:
        assert time.monotonic() < deadline, "the requests never reached the usage chart"
        page.wait_for_timeout(250)
        page.reload()
    group = page.locator('figure[data-section="model_group"][data-key="slow-model"]')
    assert int(group.get_attribute("data-requests") or 0) >= 3
    for panel in ("requests", "tokens"):
        chart = group.locator(f'svg[data-panel="{panel}"]')
        assert chart.is_visible()
        assert chart.locator("polyline").count() == 2
    assert int(group.get_attribute("data-input-tokens") or 0) > 0
    # Each legend marker has its series' colour (the line's), none the text's.
    marker = "m => getComputedStyle(document.querySelector('.legend .m-' + m), '::before').color"
    line = "m => getComputedStyle(document.querySelector('polyline.m-' + m)).stroke"
    text = page.evaluate("getComputedStyle(document.querySelector('.legend span')).color")
    metrics = ("requests", "errors", "input_tokens", "output_tokens")
    markers = {m: page.evaluate(marker, m) for m in metrics}
    assert markers == {m: page.evaluate(line, m) for m in metrics}, markers
    assert len(set(markers.values())) == len(metrics) and text not in markers.values()

    page.select_option("#id_range", "30d")
    page.select_option("#id_model_group", "slow-model")
    page.click('#usage-filter input[type="submit"]')
    page.wait_for_url("**/admin/usage/?*model_group=slow-model*")
    shown = page.locator('figure[data-section="model_group"]')
    assert shown.count() == 1 and shown.get_attribute("data-key") == "slow-model"
    principal = page.locator('figure[data-section="principal"][data-key="team-test"]')
    assert principal.get_attribute("data-requests") == group.get_attribute("data-requests")
    stack.wait_idle()


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A Node whose own policy refuses one of its two providers (R-TLS-3)."""
    providers = [
        {"id": "p-slow", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 2},
        {"id": "p-denied", "type": "cli", "command": ["/bin/false"], "capacity": 1},
    ]
    nodes = [{"id": "node-1", "providers": providers,
              "config": {"policy": {"hosts": ["{up:main}"]}}}]  # fmt: skip
    stack = Stack(
        tmp_path_factory.mktemp("browser-refusing"),
        nodes=nodes,
        models=[{"id": "slow-model", "providers": {"p-slow": "served-slow"}}],
        log_level="WARNING",
    )
    try:
        stack.start(wait_online=False)
        stack.wait_until(
            lambda snap: any(p["unavailable"] for p in snap["providers"]),
            what="p-denied reported",
        )
        stack.create_superuser("staff", PASSWORD)
        yield stack
    finally:
        stack.stop()


def test_status_page_shows_a_provider_its_node_refuses_with_the_reason_live(
    refusing: Stack, page: Page
) -> None:
    """R-TLS-3: both the first render and the live redraw show the state and the reason."""
    _sign_in(page, refusing, "/admin/pool-status/")
    denied = 'tr[data-provider="p-denied"]'
    page.evaluate(f"document.querySelector('{denied}').dataset.first = 'yes'")
    page.wait_for_selector(f"{denied}:not([data-first])")  # redrawn by the live feed
    row = page.locator(denied)
    assert row.get_attribute("data-state") == "unavailable"
    reason = row.locator('[data-field="unavailable"]').inner_text()
    assert reason == "refused by node policy: command /bin/false is not an allowed command"
    assert page.locator('tr[data-provider="p-slow"]').get_attribute("data-state") == "idle"
