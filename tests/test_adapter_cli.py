"""The cli adapter: a subprocess per run, prompt on stdin, stdout as the answer."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

import msgspec
import pytest

from nodes import wire
from nodes.agent.adapters.base import AdapterError, RunSpec
from nodes.agent.adapters.cli import CliAdapter, render_prompt
from tests.support.payloads import chat_body, cli_provider
from tests.support.pids import alive, reaped, wait_exit


def spec(body: object, *, stream: bool) -> RunSpec:
    return RunSpec(
        run_id="c1", operation="chat_completions", stream=stream, body=msgspec.json.encode(body)
    )


async def test_stream_echo_yields_chat_chunks_and_estimated_usage():
    adapter = CliAdapter(cli_provider("echo"))
    parts: list[str] = []
    prompt = "hello from stdin, ünïcödé"
    usage = await adapter.run(spec(chat_body(prompt, model="echo"), stream=True), parts.append)
    text = "".join(parts)
    blocks = text.split("\n\n")[:-1]
    assert blocks[-1] == "data: [DONE]"
    chunks = [json.loads(b[len("data: ") :]) for b in blocks[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert content == prompt
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    expected = wire.Usage(input_tokens=7, output_tokens=7, estimated=True)  # ceil(25 / 4)
    assert usage == expected
    assert chunks[-1]["usage"]["prompt_tokens"] == 7


async def test_non_stream_is_one_chat_completion():
    adapter = CliAdapter(cli_provider("echo"))
    parts: list[str] = []
    await adapter.run(spec(chat_body("just this"), stream=False), parts.append)
    assert len(parts) == 1
    reply = json.loads(parts[0])
    assert reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": "just this"}


def test_prompt_is_the_single_message_or_a_transcript_ending_with_the_last_user_turn():
    assert render_prompt([{"role": "user", "content": "only"}]) == "only"
    transcript = render_prompt(
        [
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": [{"type": "text", "text": "first"}]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second"},
        ]
    )
    assert transcript == "System: Be terse.\n\nUser: first\n\nAssistant: ok\n\nUser: second"


async def test_non_zero_exit_is_a_generic_upstream_error_with_code_and_stderr_in_the_detail():
    adapter = CliAdapter(cli_provider("fail", "3"))
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec(chat_body(), stream=False), lambda _t: None)
    assert err.value.code == "upstream_error"
    assert err.value.message == "the CLI program failed"
    assert err.value.detail == "command exited with code 3: fake tool: something went wrong"
    assert err.value.retryable  # R-HEALTH-1: like a 5xx, another provider may take it


async def test_run_timeout_kills_the_command():
    adapter = CliAdapter(cli_provider("sleep", "30", run_timeout_s=0.5))
    with pytest.raises(AdapterError) as err:
        await adapter.run(spec(chat_body(), stream=True), lambda _t: None)
    assert err.value.code == "upstream_timeout"


async def test_cancel_kills_the_command_and_its_children_and_reaps_them(tmp_path):
    pidfile = tmp_path / "pids"
    adapter = CliAdapter(cli_provider("hang", str(pidfile)))
    started = asyncio.Event()
    task = asyncio.create_task(
        adapter.run(spec(chat_body(), stream=True), lambda _t: started.set())
    )
    async with asyncio.timeout(10):
        await started.wait()
    pid, child = map(int, pidfile.read_text().split())
    assert alive(pid) and alive(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reaped(pid)  # killed and reaped: no zombie left behind
    await wait_exit(child)  # killed with its process group


async def test_env_comes_from_references_and_the_node_environment_stays_private(
    monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("CLI_TOOL_KEY", "cli-secret-value-123")
    monkeypatch.setenv("IOP_NODE_TOKEN", "node-token-must-not-leak")
    env = {"TOOL_KEY": wire.SecretRefPayload(env="CLI_TOOL_KEY")}
    provider = cli_provider("env", "TOOL_KEY", env=env)
    parts: list[str] = []
    await CliAdapter(provider).run(spec(chat_body(), stream=False), parts.append)
    assert json.loads(parts[0])["choices"][0]["message"]["content"] == "cli-secret-value-123"
    parts.clear()
    leak = cli_provider("env", "IOP_NODE_TOKEN")
    await CliAdapter(leak).run(spec(chat_body(), stream=False), parts.append)
    assert json.loads(parts[0])["choices"][0]["message"]["content"] == "<unset>"
    assert "cli-secret-value-123" not in caplog.text


async def test_missing_command_is_upstream_error():
    provider = wire.ProviderPayload(
        id="x", label="x", adapter="cli", driver="cli", command=["/nonexistent/tool-binary"]
    )
    with pytest.raises(AdapterError) as err:
        await CliAdapter(provider).run(spec(chat_body(), stream=False), lambda _t: None)
    assert (err.value.code, err.value.message) == ("upstream_error", "the CLI program failed")
    assert "cannot start /nonexistent/tool-binary" in err.value.detail
    assert (err.value.retryable, err.value.phase) == (True, wire.PHASE_CONNECT)  # R-HEALTH-1


def gone(path: str) -> bool:
    return not os.path.lexists(path)


async def test_each_run_has_a_private_empty_directory_removed_after_it_r_tls_8(
    tmp_path, monkeypatch
):
    """R-TLS-8: made for the run (empty, 0700, not the Node's own working directory), another
    one for the next run, removed with what the program left in it, also after a failure."""
    adapter = CliAdapter(cli_provider("cwd"))
    seen = []
    for _ in range(2):
        parts: list[str] = []
        await adapter.run(spec(chat_body("x"), stream=False), parts.append)
        seen.append(json.loads(json.loads(parts[0])["choices"][0]["message"]["content"]))
    for run in seen:
        assert run["entries"] == [] and run["mode"] == "0o700"
        assert run["cwd"] != os.getcwd() and gone(run["cwd"])
    assert seen[0]["cwd"] != seen[1]["cwd"]
    before = set(os.listdir(tmp_path))
    failing = CliAdapter(cli_provider("fail", "3"))
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(**kw: str) -> str:
        made.append(real_mkdtemp(**kw, dir=str(tmp_path)))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(AdapterError):
        await failing.run(spec(chat_body(), stream=False), lambda _t: None)
    assert len(made) == 1 and set(os.listdir(tmp_path)) == before  # made, then gone


async def test_a_directory_the_program_made_read_only_is_removed_too_r_tls_8(tmp_path):
    """R-TLS-8: a program that locks a directory it made cannot make its run directory stay."""
    code = (
        "import os; os.makedirs('locked/inner'); open('locked/inner/f', 'w').close(); "
        "os.chmod('locked/inner', 0o500); os.chmod('locked', 0o500); print(os.getcwd())"
    )
    provider = cli_provider()
    adapter = CliAdapter(msgspec.structs.replace(provider, command=[sys.executable, "-c", code]))
    parts: list[str] = []
    await adapter.run(spec(chat_body(), stream=False), parts.append)
    where = json.loads(parts[0])["choices"][0]["message"]["content"].strip()
    assert Path(where).name.startswith("iop-run-") and gone(where)


async def test_a_relative_program_path_still_names_the_file_beside_the_node_r_tls_8(
    tmp_path, monkeypatch
):
    """R-TLS-8: the run's directory is not the Node's; `./tool` (as the policy allows it)
    is the tool in the Node's working directory."""
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho relative-ok\n")
    tool.chmod(0o700)
    monkeypatch.chdir(tmp_path)
    adapter = CliAdapter(msgspec.structs.replace(cli_provider(), command=["./tool"]))
    parts: list[str] = []
    await adapter.run(spec(chat_body(), stream=False), parts.append)
    assert json.loads(parts[0])["choices"][0]["message"]["content"] == "relative-ok\n"
