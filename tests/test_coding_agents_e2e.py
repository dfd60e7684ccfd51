"""The real coding agents, unchanged, through the gateway (R-CLIENT-1): ``claude -p`` and
``codex exec`` at their pinned versions (scripts/install-clients.sh) against a real Edge,
through a group translated to a Chat Completions provider and through a native one. Each
prints the upstream's answer and exits 0, and every request it sent was answered 2xx (the
Edge's access log). Without node/npm the module skips with the reason; the recorded requests
of both still run in tests/test_client_fixtures_e2e.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Stack
from tests.support.clients import BIN, clients_stack, installed, run_claude, run_codex
from tests.support.journeys import JOURNEYS_MD, doc_blocks, run_script, with_ports

pytestmark = pytest.mark.slow

# One iop.access line per /v1 request (IOP_ACCESS_LOG=1): operation, model group, status.
ACCESS = re.compile(r"iop\.access (?P<operation>\w+) (?P<group>\S+) (?P<status>\d{3}) ")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    missing = installed()
    if missing is not None:
        pytest.skip(missing)
    with clients_stack(tmp_path_factory.mktemp("agents")) as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(stack: Stack) -> Iterator[None]:
    stack.reset_upstreams()
    for name in ("main", "claude"):
        stack.upstream(name).server.call_tools = False  # "Say hello" is answered in text
    yield
    stack.wait_idle()  # R-POOL-9


def edge_log(stack: Stack) -> str:
    assert stack.edge is not None
    return stack.edge.log.read_text(errors="replace")


def answered(stack: Stack, since: int) -> list[tuple[str, int]]:
    """(operation, status) of each /v1 request in the Edge's access log after ``since``."""
    text = edge_log(stack)[since:]
    return [(m["operation"], int(m["status"])) for m in ACCESS.finditer(text)]


def check_all_2xx(stack: Stack, since: int, operation: str) -> None:
    """The access log's lines are written as each request ends, just after its answer."""
    stack.wait_until(
        lambda _: (operation, 200) in answered(stack, since), what="the access log's line"
    )
    seen = answered(stack, since)
    assert all(200 <= status < 300 for _, status in seen), seen


@pytest.mark.parametrize(
    ("model", "upstream"), [("claude-over-chat", "main"), ("claude-native", "claude")]
)
def test_claude_code_prints_the_upstream_answer(
    stack: Stack, tmp_path: Path, model: str, upstream: str
) -> None:
    since = len(edge_log(stack))
    done = run_claude(tmp_path, stack, model, "Say hello")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    result = json.loads(done.stdout)
    assert result["is_error"] is False
    assert result["result"] == stack.upstream(upstream).server.reply_text
    check_all_2xx(stack, since, "messages")


@pytest.mark.parametrize("model", ["codex-over-glm", "codex-native"])
def test_codex_prints_the_upstream_answer(stack: Stack, tmp_path: Path, model: str) -> None:
    since = len(edge_log(stack))
    done = run_codex(tmp_path, stack, model, "Say hello")
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert stack.upstream("main").server.reply_text in done.stdout
    check_all_2xx(stack, since, "responses")


AGENTS = doc_blocks(JOURNEYS_MD, "agents")


@pytest.mark.parametrize(
    ("block", "operation"), [("claude-code", "messages"), ("codex", "responses")]
)
def test_the_journeys_page_set_up_runs_as_written(
    stack: Stack, tmp_path: Path, block: str, operation: str
) -> None:
    """docs/journeys.md, "Coding agents": each block as a reader runs it (the example port
    is the Edge's), in a fresh home, with the CLIs on PATH and ``IOP_TOKEN`` set."""
    since = len(edge_log(stack))
    env = {
        "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "IOP_TOKEN": stack.token,
    }
    script = with_ports(AGENTS[block], stack.ports)
    printed = run_script(script, tmp_path, env)
    assert stack.upstream("main").server.reply_text in printed
    check_all_2xx(stack, since, operation)
