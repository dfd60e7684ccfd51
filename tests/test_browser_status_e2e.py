"""The pool status page in a real browser: it follows a slow request live, without a reload.

Headless Debian Chromium (``scripts/install-browser.sh``) driven by Playwright; never a
downloaded browser. R-POOL-8 (what the page shows), R-POOL-9 (back to 0 afterwards).
"""

from __future__ import annotations

import http.client
import json
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


def _slow_request(stack: Stack) -> http.client.HTTPConnection:
    """Send a chat request and return without reading the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", stack.ports["openai"], timeout=30)
    body = json.dumps({"model": "slow-model", "messages": [{"role": "user", "content": "hi"}]})
    conn.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
    )
    return conn


def test_status_page_shows_in_flight_change_live_while_a_slow_request_runs(
    stack: Stack, page: Page
) -> None:
    page.goto(stack.openai_url + "/admin/pool-status/")
    assert "/admin/login/" in page.url  # staff only: the login comes first
    admin_login(page, "staff", PASSWORD)
    page.wait_for_url("**/admin/pool-status/")

    row = page.locator(ROW)
    assert row.get_attribute("data-state") == "idle"
    assert row.locator('[data-field="in_flight"]').inner_text().strip() == "0 / 2"
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads

    stack.upstream().server.faults.stall_before_first_byte = 3.0
    conn = _slow_request(stack)
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
