"""Provider health on the pool status page in a real browser: an ejection shows its colour,
reason and time left, then the recovery, without a reload.

Headless Debian Chromium (``scripts/install-browser.sh``) driven by Playwright; never a
downloaded browser. R-HEALTH-4 (health state, reason and time left on the status page).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support import Stack
from tests.support.browser import NEEDS_CHROMIUM, admin_login, browser_page

if TYPE_CHECKING:
    from playwright.sync_api import Page

PASSWORD = "browser-health-password"
FLAKY = 'tr[data-provider="p-flaky"]'
EJECTED_COLOUR = "rgb(106, 27, 154)"  # --ejected in templates/admin/pool_status.html

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("browser-health"),
        upstreams={"flaky": "openai"},
        providers=[{"id": "p-flaky", "profile": "openai", "base_url": "{up:flaky}/v1"}],
        models=[{"id": "flaky-model", "providers": {"p-flaky": "served-flaky"}}],
        pool={"eject_after_failures": 2, "eject_base_s": 3},
        log_level="WARNING",
    ) as running:
        running.create_superuser("staff", PASSWORD)
        yield running


@pytest.fixture
def page(stack: Stack) -> Iterator[Page]:
    with browser_page() as tab:
        yield tab


def _answer_status(stack: Stack) -> int:
    return stack.chat_status("flaky-model")


def test_status_page_shows_an_ejection_with_reason_and_time_left_then_the_recovery_r_health_4(
    stack: Stack, page: Page
) -> None:
    page.goto(stack.openai_url + "/admin/pool-status/")
    admin_login(page, "staff", PASSWORD)
    page.wait_for_url("**/admin/pool-status/")
    row = page.locator(FLAKY)
    assert row.get_attribute("data-state") == "idle"
    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    flaky = stack.upstream("flaky")
    flaky.go_down()
    try:
        assert [_answer_status(stack) for _ in range(2)] == [502, 502]
        page.wait_for_selector(f'{FLAKY}[data-state="ejected"]')
        health = row.locator('[data-field="health"]').inner_text()
        assert health.startswith("cannot connect to the upstream (2 failures in a row); back in ")
        assert health.endswith(" s")
        colour = row.locator(".badge").evaluate("el => getComputedStyle(el).backgroundColor")
        assert colour == EJECTED_COLOUR  # not the idle green
    finally:
        flaky.come_back()
    page.wait_for_selector(f'{FLAKY}[data-state="probing"]')
    assert _answer_status(stack) == 200  # the trial request succeeds
    page.wait_for_selector(f'{FLAKY}[data-state="idle"]')
    assert row.locator('[data-field="health"]').inner_text().strip() == "-"
    assert page.evaluate("window.__sameDocument") is True
    stack.wait_idle()
