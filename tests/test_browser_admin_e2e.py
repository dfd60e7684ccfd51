"""The admin as an operator walks it, in a real browser against a managed Edge over TLS: the
product's name, a capacity edited in the catalog, its dry-run report showing ``2 → 5``, the
apply that makes it run, then a route created and its key rotated, each key shown once and
working for the official SDK straight away.

Headless Debian Chromium (``scripts/install-browser.sh``) driven by Playwright, a real Edge
(runedge, https) and Node (iop-node, wss). R-REF-4 (the report), R-REF-6 (no secret in it),
R-MGD-3 (routes: the key shown once, only its sha256 stored), R-AUTH-5 (a rotated key).
"""

from __future__ import annotations

import hashlib
import re
import ssl
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from tests.support import Stack
from tests.support.browser import NEEDS_CHROMIUM, admin_login, browser_page, crawl_admin
from tests.support.managed import managed_stack, mint_keys
from tests.support.tls import Pki

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = NEEDS_CHROMIUM

PASSWORD = "browser-admin-password"
SECRET = "sk-browser-slot-5d1c7e"
CAPACITY_PATH = 'nodes["node-1"].providers["glm-general"].capacity'


class Walk:
    def __init__(self, stack: Stack, pki: Pki) -> None:
        self.stack, self.pki = stack, pki

    def chat(self, key: str) -> int:
        """The status the official SDK gets for a chat with this route key (200 on success)."""
        context = ssl.create_default_context(cafile=self.pki.ca_file)
        with openai.OpenAI(
            base_url=self.stack.v1_url,
            api_key=key,
            http_client=httpx.Client(verify=context),
            max_retries=0,
        ) as client:
            try:
                client.chat.completions.create(
                    model="glm", messages=[{"role": "user", "content": "hi"}]
                )
            except openai.APIStatusError as exc:
                return exc.status_code
        return 200


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    directory = tmp_path_factory.mktemp("browser-admin")
    pki = Pki(directory / "pki")
    stack = managed_stack(directory, pki, mint_keys(directory / "keys", "node-1"))
    with stack:
        # The catalog the admin edits starts as the running config (docs/catalog.md).
        stack.manage("iop_config", "import", str(stack.config_path))
        stack.manage("iop_slot", "set", "glm-main", "--profile", "glm", stdin=SECRET.encode())
        stack.create_superuser("staff", PASSWORD)
        yield Walk(stack, pki)


@pytest.fixture
def page(walk: Walk) -> Iterator[Page]:
    with browser_page(test_ca=True) as tab:
        yield tab


def route_key(page: Page) -> str:
    return page.locator("#route-key").inner_text().strip()


def test_an_operator_edits_a_capacity_sees_2_to_5_applies_and_makes_a_route(
    walk: Walk, page: Page
) -> None:
    """R-REF-4, R-MGD-3: the whole walk, as the operator's pages show it."""
    admin = walk.stack.openai_url + "/admin/"
    page.goto(admin)
    admin_login(page, "staff", PASSWORD)
    page.wait_for_url(admin)
    assert page.locator("#site-name").inner_text().strip() == "IOP Edge"
    assert "IOP Edge" in page.title() and "Django" not in page.content()

    # A capacity edited in the catalog changes nothing that runs yet.
    assert walk.stack.provider("glm-general")["capacity"] == 2
    page.goto(admin + "catalog/provider/")
    page.get_by_role("link", name="glm-general", exact=True).click()
    page.fill("#id_capacity", "5")
    page.click("input[name=_save]")
    page.wait_for_url(admin + "catalog/provider/")

    # The dry-run of a revision made from the catalog shows the old and new value.
    page.goto(admin + "refresh/configrevision/")
    page.click("input[value='Create revision from catalog']")
    page.wait_for_url("**/dry-run/")
    row = page.locator("tr", has_text=CAPACITY_PATH)
    assert row.locator("td.refresh-values").inner_text().strip() == "2 → 5"
    assert "live" in row.inner_text()
    assert SECRET not in page.content()

    # Apply: the pool runs with 5, and the revision's own report keeps 2 → 5.
    page.click("input[value='Apply live']")
    page.wait_for_selector("ul.messagelist li.info")
    assert "Applied revision" in page.locator("ul.messagelist").inner_text()
    walk.stack.wait_until(
        lambda snap: (
            next(p for p in snap["providers"] if p["provider_id"] == "glm-general")["capacity"] == 5
        ),
        10,
        "capacity 5 applied",
    )
    stored = page.locator("tr", has_text=CAPACITY_PATH).locator("td.refresh-values")
    assert stored.inner_text().strip() == "2 → 5"

    # A route made in the admin: its key once, working at once, stored only as sha256.
    page.goto(admin + "catalog/route/add/")
    page.fill("#id_key", "team-browser")
    page.select_option("#id_model_group", "glm")
    page.fill("#id_slots", "glm=glm-main")
    page.click("input[name=_save]")
    page.wait_for_selector("#route-key")
    first = route_key(page)
    assert first.startswith("iop_route_") and "shown only now" in page.content()
    assert walk.chat(first) == 200
    page.click("text=Back to the route")
    page.wait_for_selector("#rotate-route-key")
    assert first not in page.content()
    assert hashlib.sha256(first.encode()).hexdigest()[:12] in page.content()

    # Rotated: a new key shown once; the old one is refused, the new one works.
    page.click("#rotate-route-key")  # asks first: the caller's key still works
    page.wait_for_selector("#confirm-rotate-key")
    assert "stops working" in page.content() and walk.chat(first) == 200
    page.click("#confirm-rotate-key")
    page.wait_for_selector("#route-key")
    second = route_key(page)
    assert second != first and second.startswith("iop_route_")
    assert walk.chat(first) == 401
    assert walk.chat(second) == 200
    page.goto(admin + "catalog/route/")
    assert first not in page.content() and second not in page.content()
    walk.stack.wait_idle()


VIEWER = "viewer"  # staff, not a superuser: every model's view permission, nothing else
MAKE_VIEWER = (
    "from django.contrib.auth.models import Permission, User\n"
    f"user = User.objects.create_user({VIEWER!r}, password={PASSWORD!r}, is_staff=True)\n"
    "user.user_permissions.set(Permission.objects.filter(codename__startswith='view_'))\n"
)


@pytest.fixture(scope="module")
def crawlable(walk: Walk) -> Walk:
    """The walk's Edge with a read-only staff user and a route of its own (so a route's
    pages exist whichever test ran first)."""
    walk.stack.manage("shell", "-c", MAKE_VIEWER)
    walk.stack.manage(
        "iop_route", "create", "team-crawl", "--model", "glm", "--slot", "glm=glm-main"
    )
    return walk


@pytest.mark.parametrize("username", ["staff", VIEWER])
def test_every_admin_page_answers_without_a_server_error(
    crawlable: Walk, page: Page, username: str
) -> None:
    """Every page reachable from the admin index, for a superuser and for a staff user who
    may only view: none answers 500. The superuser reaches every table's list, add form and
    an object's pages (a route's key rotation asks first); the viewer every list, no add form."""
    origin = crawlable.stack.openai_url
    page.goto(origin + "/admin/")
    admin_login(page, username, PASSWORD)
    page.wait_for_url(origin + "/admin/")
    seen = crawl_admin(page, origin)
    errors = {path: status for path, status in seen.items() if status >= 500}
    assert not errors, errors
    lists = {p for p in seen if re.fullmatch(r"/admin/[^/]+/[^/]+/", p)}
    expected = {
        "/admin/catalog/route/", "/admin/catalog/credentialslot/", "/admin/catalog/provider/",
        "/admin/pool/requestlogentry/", "/admin/refresh/configrevision/", "/admin/auth/user/",
    }  # fmt: skip
    assert expected <= lists, sorted(lists)
    assert {"/admin/pool-status/", "/admin/usage/"} <= set(seen)
    adds = {p for p in seen if p.endswith("/add/")}
    if username == VIEWER:
        assert not adds, adds
        return
    assert "/admin/catalog/route/add/" in adds and len(adds) >= 8, sorted(adds)
    assert any(p.endswith("/rotate-key/") for p in seen), sorted(seen)
    assert any(p.endswith("/dry-run/") for p in seen), sorted(seen)
