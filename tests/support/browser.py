"""Headless Debian Chromium driven by Playwright, for tests of pages in a real browser.

Never a downloaded browser: ``scripts/install-browser.sh`` installs Debian's package; tests
that need it carry ``NEEDS_CHROMIUM`` and skip where it is missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

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


ADMIN_SKIP = ("/admin/logout/", "/admin/r/", "/admin/jsi18n/")  # sign-out, off-site redirects
_OBJECT = re.compile(r"^(/admin/[^/]+/[^/]+/)(?!add/)[^/]+/")


def crawl_admin(page: Page, origin: str, limit: int = 400) -> dict[str, int]:
    """Every admin page reachable by links from the index, as the signed-in user sees it:
    path -> HTTP status. Query strings are dropped and, per model, one object's pages are
    followed (its change, history, delete and own pages), so the walk stays bounded. A GET
    here changes nothing: every admin action is a POST."""
    seen: dict[str, int] = {}
    per_object: dict[str, str] = {}  # "/admin/app/model/" -> the one object id followed
    queue = ["/admin/"]
    while queue and len(seen) < limit:
        path = queue.pop(0)
        if path in seen:
            continue
        response = page.goto(origin + path)
        seen[path] = response.status if response is not None else 0
        if seen[path] >= 400 or not path.startswith("/admin/"):
            continue
        hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
        for href in hrefs:
            target = urlsplit(href)
            if target.netloc != urlsplit(origin).netloc or not target.path.startswith("/admin/"):
                continue
            link = target.path
            if link.startswith(ADMIN_SKIP) or link in seen:
                continue
            found = _OBJECT.match(link)
            if found is not None:  # an object's page: only the first object of its model
                model = found.group(1)
                object_id = link[len(model) :].split("/", 1)[0]
                if per_object.setdefault(model, object_id) != object_id:
                    continue
            queue.append(link)
    return seen
