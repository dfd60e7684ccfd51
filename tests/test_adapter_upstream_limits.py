"""R-TLS-4 on every adapter: no redirects, no cookies kept, byte caps on non-stream bodies,
NDJSON lines and CLI output, a default CLI run timeout, and a CLI's whole process group
killed however the run ends."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from nodes.agent.adapters.base import AdapterError, RunSpec
from nodes.agent.adapters.cli import CliAdapter
from nodes.agent.adapters.http import HttpClient
from nodes.agent.adapters.ollama import OllamaAdapter
from nodes.agent.adapters.openai_compat import OpenAICompatAdapter
from nodes.agent.limits import Limits, MiB
from tests.fakes import FakeOllama, FakeOpenAI
from tests.support.payloads import chat_body, cli_provider, ollama_provider, openai_provider
from tests.support.pids import alive, reaped, wait_exit

SMALL = Limits(max_body_bytes=1 * MiB, max_line_bytes=64 * 1024, cli_max_output_bytes=256 * 1024)
SLACK = 16 * MiB  # socket and reader buffers: far below the fault's 1 GiB


def spec(*, stream: bool, operation: str = "chat_completions") -> RunSpec:
    body = msgspec.json.encode(chat_body())
    return RunSpec(run_id="r1", operation=operation, stream=stream, body=body)


async def _nothing(_text: str) -> None:
    return None


@pytest.fixture
async def upstream_http():
    client = HttpClient(SMALL)
    yield client
    await client.aclose()


@pytest.fixture
async def other():
    """Where a redirect points: it must never see a request."""
    async with FakeOpenAI() as server:
        yield server


@pytest.mark.parametrize("kind", ["openai_compat", "ollama"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_redirect_to_another_host_is_an_upstream_error_and_is_not_followed(
    upstream_http, other, kind, stream
):
    """R-TLS-4: a 307 (which would replay the prompt and the key) ends the run."""
    fake = FakeOpenAI() if kind == "openai_compat" else FakeOllama()
    async with fake as upstream:
        upstream.faults.redirect_to = other.url + "/v1/chat/completions"
        if kind == "openai_compat":
            adapter: OpenAICompatAdapter | OllamaAdapter = OpenAICompatAdapter(
                openai_provider(upstream.url), upstream_http
            )
        else:
            adapter = OllamaAdapter(ollama_provider(upstream.url), upstream_http)
        with pytest.raises(AdapterError) as failed:
            await adapter.run(spec(stream=stream), _nothing)
    assert failed.value.code == "upstream_error"
    assert failed.value.message == "the upstream answered HTTP 307, a redirect: not followed"
    assert f"(a redirect to 127.0.0.1:{other.port})" in failed.value.detail  # the Node's log
    assert other.requests == []


async def test_cookies_an_upstream_sets_are_never_sent_back(upstream_http):
    """R-TLS-4: no cookie jar, so one caller's upstream session never reaches the next."""
    async with FakeOpenAI() as upstream:
        upstream.faults.set_cookie = "session=caller-one; Path=/"
        adapter = OpenAICompatAdapter(openai_provider(upstream.url), upstream_http)
        await adapter.run(spec(stream=False), _nothing)
        await adapter.run(spec(stream=False), _nothing)
    assert len(upstream.requests) == 2
    assert all("cookie" not in r.headers for r in upstream.requests)


async def test_a_huge_non_stream_body_is_refused_as_soon_as_it_passes_the_cap(upstream_http):
    """R-TLS-4: reading stops at limits.max_body_bytes; the upstream is cut off."""
    async with FakeOpenAI() as upstream:
        upstream.faults.endless_body = b"x" * 65536
        adapter = OpenAICompatAdapter(openai_provider(upstream.url), upstream_http)
        with pytest.raises(AdapterError) as failed:
            await adapter.run(spec(stream=False), _nothing)
        async with asyncio.timeout(10):
            await upstream.disconnected.wait()
    assert failed.value.code == "upstream_error"
    assert f"over {SMALL.max_body_bytes} bytes (limits.max_body_bytes)" in failed.value.message
    assert upstream.endless_sent < SMALL.max_body_bytes + SLACK


async def test_an_ndjson_line_without_a_newline_is_refused_at_the_line_cap(upstream_http):
    """R-TLS-4: Ollama's stream is split on newlines; an endless line stops at the cap."""
    async with FakeOllama() as upstream:
        upstream.faults.endless_body = b"y" * 8192
        adapter = OllamaAdapter(ollama_provider(upstream.url), upstream_http)
        with pytest.raises(AdapterError) as failed:
            await adapter.run(spec(stream=True), _nothing)
        async with asyncio.timeout(10):
            await upstream.disconnected.wait()
    assert f"line over {SMALL.max_line_bytes} bytes (limits.max_line_bytes)" in (
        failed.value.message
    )
    assert upstream.endless_sent < SMALL.max_line_bytes + SLACK


async def test_a_cli_that_forks_a_child_and_exits_leaves_no_child_behind(tmp_path):
    """R-TLS-4: the run ends when the command exits and its process group is killed, even
    though the child still holds stdout open."""
    pidfile = tmp_path / "pids"
    adapter = CliAdapter(cli_provider("fork", str(pidfile)), SMALL)
    parts: list[str] = []
    async with asyncio.timeout(20):  # without the group kill this waits for the child
        await adapter.run(spec(stream=False), parts.append)
    assert "forked" in "".join(parts)
    pid, child = map(int, pidfile.read_text().split())
    assert reaped(pid)
    await wait_exit(child)
    assert not alive(child)


async def test_cli_output_over_the_cap_ends_the_run_and_kills_the_command(tmp_path):
    """R-TLS-4: limits.cli_max_output_bytes bounds what a run may print."""
    adapter = CliAdapter(cli_provider("flood"), SMALL)
    with pytest.raises(AdapterError) as failed:
        async with asyncio.timeout(20):
            await adapter.run(spec(stream=True), _nothing)
    assert failed.value.code == "upstream_error"
    assert "(limits.cli_max_output_bytes)" in failed.value.message


async def test_a_cli_run_without_its_own_timeout_gets_the_default_one():
    """R-TLS-4: limits.cli_run_timeout_s applies when the provider sets no run_timeout_s."""
    adapter = CliAdapter(cli_provider("sleep", "30"), Limits(cli_run_timeout_s=0.5))
    with pytest.raises(AdapterError) as failed:
        async with asyncio.timeout(20):
            await adapter.run(spec(stream=False), _nothing)
    assert failed.value.code == "upstream_timeout"
    assert "0.5s" in failed.value.message


def test_the_node_limits_have_documented_defaults():
    """R-TLS-4: the defaults docs/node.md names."""
    assert Limits() == Limits(
        max_body_bytes=64 * MiB,
        max_line_bytes=1 * MiB,
        cli_max_output_bytes=16 * MiB,
        cli_run_timeout_s=600.0,
    )
