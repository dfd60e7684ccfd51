"""``admin.token`` on a real Edge (daphne on loopback, a real Node): the control listener
answers /pool, /metrics and /refresh only with the token (docs/configuration.md, "admin")."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import yaml

from tests.support import Stack

pytestmark = pytest.mark.slow

ADMIN_TOKEN = "ctl-e2e-4b8f2a6d1c"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("control-token"), admin_token=ADMIN_TOKEN) as running:
        yield running


def plain_get(stack: Stack, path: str, token: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(stack.control_url + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.parametrize("path", ["/pool", "/metrics"])
@pytest.mark.parametrize("token", [None, "not-the-admin-token"])
def test_without_the_admin_token_the_control_listener_answers_401(
    stack: Stack, path: str, token: str | None
) -> None:
    status, headers, body = plain_get(stack, path, token)
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert json.loads(body)["error"]["code"] == "invalid_api_key"
    assert ADMIN_TOKEN.encode() not in body


def test_a_refresh_without_the_admin_token_is_refused(stack: Stack) -> None:
    document = yaml.safe_load(stack.config_path.read_text())
    request = urllib.request.Request(
        stack.control_url + "/refresh",
        data=json.dumps({"mode": "apply", "config": document}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 401
    refused.value.close()


def test_with_the_admin_token_pool_metrics_and_refresh_work(stack: Stack) -> None:
    assert plain_get(stack, "/pool", ADMIN_TOKEN)[0] == 200
    assert stack.metrics_text()
    status, report = stack.refresh("dry_run", yaml.safe_load(stack.config_path.read_text()))
    assert status == 200 and report["valid"] is True
