"""The fake upstreams also run as their own processes, for end-to-end tests."""

from __future__ import annotations

import asyncio
import signal
import sys

import msgspec
import pytest

from nodes import wire
from nodes.agent.adapters.base import RunSpec
from nodes.agent.adapters.http import HttpClient
from nodes.agent.adapters.ollama import OllamaAdapter
from nodes.agent.adapters.openai_compat import OpenAICompatAdapter
from tests.support.payloads import chat_body, ollama_provider, openai_provider
from tests.support.processes import ROOT


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["openai", "ollama"])
async def test_fake_upstream_runner_prints_its_port_and_serves_until_sigterm(kind):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.upstream",
        "--kind",
        kind,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    http = HttpClient()
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            port = int(await proc.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        adapter = (
            OpenAICompatAdapter(openai_provider(url), http)
            if kind == "openai"
            else OllamaAdapter(ollama_provider(url), http)
        )
        parts: list[str] = []
        request = RunSpec(
            run_id="x",
            operation="chat_completions",
            stream=False,
            body=msgspec.json.encode(chat_body()),
        )
        usage = await adapter.run(request, parts.append)
        assert isinstance(usage, wire.Usage) and usage.output_tokens > 0
        assert '"choices"' in "".join(parts)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            assert await proc.wait() == 0
    finally:
        await http.aclose()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
