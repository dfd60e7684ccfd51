"""The pool status page in a real browser: it follows a slow request live, without a reload.

Headless Debian Chromium (``scripts/install-browser.sh``) driven by Playwright; never a
downloaded browser. R-POOL-8 (what the page shows), R-POOL-9 (back to 0 afterwards).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import ROOT, Stack

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PASSWORD = "browser-test-password"
ROW = 'tr[data-provider="p-slow"]'

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium at /usr/bin/chromium: run scripts/install-browser.sh",
    ),
]


def _create_staff(stack: Stack) -> None:
    """A superuser in the running Edge's own database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "PYTEST_"))}
    env.update(
        {
            "DATABASE_URL": f"sqlite:///{stack.dir / 'edge.sqlite3'}",
            "IOP_VAR_DIR": str(stack.dir / "var"),
            "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
        }
    )
    subprocess.run(
        [
            sys.executable,
            "manage.py",
            "createsuperuser",
            "--noinput",
            "--username",
            "staff",
            "--email",
            "staff@localhost",
        ],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )


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
        _create_staff(running)
        yield running


@pytest.fixture
def page(stack: Stack) -> Iterator[Page]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page()
            tab.set_default_timeout(15_000)
            yield tab
        finally:
            browser.close()


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
    page.fill("#id_username", "staff")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
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
