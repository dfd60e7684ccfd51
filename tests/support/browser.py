"""Headless Debian Chromium driven by Playwright, for tests of pages in a real browser.

Never a downloaded browser: ``scripts/install-browser.sh`` installs Debian's package; tests
that need it carry ``NEEDS_CHROMIUM`` and skip where it is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

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

NEEDS_CHROMIUM = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium at /usr/bin/chromium: run scripts/install-browser.sh",
    ),
]


@contextmanager
def browser_page(timeout_ms: int = 15_000, *, test_ca: bool = False) -> Iterator[Page]:
    """A fresh page in a fresh headless browser, closed afterwards. ``test_ca``: accept the
    certificate of a test PKI (``tests.support.tls``), which the browser's store lacks."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(ignore_https_errors=test_ca)
            tab.set_default_timeout(timeout_ms)
            yield tab
        finally:
            browser.close()


def admin_login(page: Page, username: str, password: str) -> None:
    """Fill and submit the admin login form the page shows."""
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
