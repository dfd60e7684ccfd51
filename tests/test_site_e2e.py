"""The three listeners of one Edge process, each serving only its role (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support import Stack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    providers = [{"id": "p", "profile": "openai", "base_url": "{up:main}/v1", "capacity": 1}]
    with Stack(
        tmp_path_factory.mktemp("site"),
        providers=providers,
        models=[{"id": "m", "providers": {"p": "m"}}],
    ) as running:
        yield running


def test_the_admin_site_and_its_static_files_are_served_on_the_openai_listener(stack: Stack):
    login = httpx.get(stack.openai_url + "/admin/login/", timeout=5)
    assert login.status_code == 200 and "csrfmiddlewaretoken" in login.text
    css = httpx.get(stack.openai_url + "/static/admin/css/base.css", timeout=5)
    assert css.status_code == 200
    assert css.headers["content-type"].startswith("text/css")


def test_the_admin_listener_serves_no_django_pages_and_the_openai_listener_no_refresh(
    stack: Stack,
):
    assert httpx.get(stack.control_url + "/admin/login/", timeout=5).status_code == 404
    refresh = httpx.post(stack.openai_url + "/refresh", json={"mode": "dry_run"}, timeout=5)
    assert refresh.status_code in (404, 405)
    pool = httpx.get(stack.openai_url + "/pool", timeout=5)
    assert pool.status_code == 404
