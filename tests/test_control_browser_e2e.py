"""The control listener of a real Edge refuses what a web page on the Edge's machine could
send it (R-CTL-1, docs/refresh.md): a cross-origin ``text/plain`` stage never becomes a
staged revision; the same document sent as curl sends it does."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest
import yaml

from tests.support import Stack

pytestmark = pytest.mark.slow

STAGED_COUNT = (
    "from refresh.models import ConfigRevision as R; "
    "print(R.objects.filter(state='staged').count())"
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack(tmp_path_factory.mktemp("control-browser")) as running:
        yield running


def post_stage(stack: Stack, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", stack.ports["admin"], timeout=10)
    try:
        conn.request("POST", "/refresh?mode=stage", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def staged(stack: Stack) -> int:
    return int(stack.manage("shell", "-c", STAGED_COUNT).split()[-1])


def test_a_cross_origin_text_plain_stage_is_refused_and_nothing_is_staged(stack: Stack) -> None:
    """R-CTL-1: a page's fetch (Origin, text/plain), a DNS-rebound page (foreign Host) and a
    form post are refused; nothing is staged. curl's way (application/yaml) stages."""
    document = yaml.safe_load(stack.config_path.read_text())
    document["nodes"][0]["token_hash_sha256"] = "a" * 64  # a page's own Node token
    body = yaml.safe_dump(document).encode()
    own = f"127.0.0.1:{stack.ports['admin']}"
    page = {"Host": own, "Origin": "http://evil.example", "Content-Type": "text/plain"}
    status, answer = post_stage(stack, body, page)
    assert (status, answer["error"]["code"]) == (403, "forbidden")
    rebound = {"Host": f"evil.example:{stack.ports['admin']}", "Content-Type": "text/plain"}
    status, answer = post_stage(stack, body, rebound)
    assert (status, answer["error"]["code"]) == (403, "forbidden")
    form = {"Host": own, "Content-Type": "application/x-www-form-urlencoded"}
    status, answer = post_stage(stack, body, form)
    assert (status, answer["error"]["code"]) == (415, "unsupported_media_type")
    assert staged(stack) == 0
    status, answer = post_stage(stack, body, {"Host": own, "Content-Type": "application/yaml"})
    assert status == 200 and answer["outcome"] == "staged", answer
    assert staged(stack) == 1
