"""Admin login throttling through the real login form of a running Edge, in a real browser.

The limit comes from ``IOP_ADMIN_LOGIN_FAILURE_LIMIT`` in the Edge's environment, so the
setting is proven end to end (docs/admin.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Stack
from tests.support.browser import NEEDS_CHROMIUM, admin_login, browser_page

PASSWORD = "throttle-test-password"
LIMIT = 3

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(
        tmp_path_factory.mktemp("login"),
        env={"IOP_ADMIN_LOGIN_FAILURE_LIMIT": str(LIMIT)},
        log_level="WARNING",
    ) as running:
        running.create_superuser("staff", PASSWORD)
        yield running


def test_the_login_form_locks_out_after_the_configured_failures_then_refuses_the_password(
    stack: Stack,
):
    with browser_page() as page:
        page.goto(stack.openai_url + "/admin/login/?next=/admin/")
        for _ in range(LIMIT - 1):
            admin_login(page, "staff", "wrong-password")
            page.wait_for_selector(".errornote")  # the form again, with its error
        admin_login(page, "staff", "wrong-password")
        page.wait_for_load_state()
        assert "too many login attempts" in page.content()

        page.goto(stack.openai_url + "/admin/login/?next=/admin/")
        admin_login(page, "staff", PASSWORD)
        page.wait_for_load_state()
        assert "too many login attempts" in page.content()
        page.goto(stack.openai_url + "/admin/")
        assert "/admin/login/" in page.url  # still not logged in
