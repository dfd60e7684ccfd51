"""``iop-node --config node.yaml`` as a real process against a fake Edge."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nodes.agent.main import main
from tests.fakes import FakeOpenAI
from tests.fakes.edge import FakeEdge
from tests.support.payloads import chat_body, node_payload, openai_provider
from tests.support.processes import ROOT


def node_command(config: Path) -> list[str]:
    script = ROOT / ".venv" / "bin" / "iop-node"
    if script.exists():
        return [str(script), "--config", str(config)]
    return [sys.executable, "-m", "nodes.agent.main", "--config", str(config)]


def write_config(path: Path, edge: FakeEdge) -> Path:
    path.write_text(
        f"node_id: {edge.node_id}\nedge_url: {edge.url}\ntoken: {{env: IOP_TEST_NODE_TOKEN}}\n"
    )
    return path


@pytest.mark.slow
async def test_iop_node_connects_runs_a_request_and_exits_0_on_sigterm(tmp_path):
    async with (
        FakeOpenAI() as upstream,
        FakeEdge(node_payload(openai_provider(upstream.url, pid="p1"))) as edge,
    ):
        config = write_config(tmp_path / "node.yaml", edge)
        log_path = tmp_path / "node.log"
        env = os.environ | {"IOP_TEST_NODE_TOKEN": edge.token}
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *node_command(config),
                "--log-level",
                "DEBUG",
                cwd=ROOT,
                env=env,
                stdout=log_file,
                stderr=log_file,
            )
            try:
                conn = await edge.next_connection(within=30)
                body = chat_body(stream=True, stream_options={"include_usage": True})
                await conn.tunnel("p-1", "p1", "chat_completions", body, stream=True)
                run = await conn.wait_end("p-1")
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(20):
                    code = await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        logs = log_path.read_text()
        assert code == 0, logs
        assert run.ends[0].ok and run.text == upstream.requests[0].response.decode()
        async with asyncio.timeout(5):
            await conn.closed.wait()
        assert conn.close_code == 1001
        assert edge.token not in logs
        assert "ready: generation 1" in logs


def test_invalid_config_exits_2_and_lists_every_error(tmp_path, capsys):
    bad = tmp_path / "node.yaml"
    bad.write_text("node_id: n\nedge_url: http://edge\ntoken: literal-token-value\nextra: 1\n")
    assert main(["--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "edge_url: must start with ws:// or wss://" in err
    assert "token: must be a reference" in err
    assert "extra: unknown key" in err
    assert "literal-token-value" not in err


def test_check_flag_validates_and_exits_0(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("X", "a-node-token")
    good = tmp_path / "node.yaml"
    good.write_text("node_id: n\nedge_url: ws://127.0.0.1:1/ws/node\ntoken: {env: X}\n")
    assert main(["--config", str(good), "--check"]) == 0
    assert "ok" in capsys.readouterr().out


@pytest.mark.parametrize("check", [["--check"], []])
def test_a_token_that_does_not_resolve_exits_2_instead_of_retrying(
    tmp_path, capsys, monkeypatch, check
):
    """``--check`` resolves the token, and a Node without one never dials (docs/node.md)."""
    monkeypatch.delenv("IOP_NODE_TOKEN_UNSET", raising=False)
    path = tmp_path / "node.yaml"
    path.write_text(
        "node_id: n\nedge_url: ws://127.0.0.1:1/ws/node\ntoken: {env: IOP_NODE_TOKEN_UNSET}\n"
    )
    assert main(["--config", str(path), *check]) == 2
    assert "token: environment variable IOP_NODE_TOKEN_UNSET is not set" in capsys.readouterr().err


@pytest.mark.slow  # starts real processes: left out of `make test-fast`
def test_the_agent_imports_nothing_from_django():
    code = (
        "import sys, nodes.agent.main, nodes.agent.cli, nodes.agent.client, nodes.agent.registry\n"
        "bad = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


OLD_STYLE_POLICY = 'policy:\n  commands: [["claude", "-p"], ["tool", "--version", "$"]]\n'
WHAT_CHANGED = "policy.commands: an entry now allows exactly its argv; before this version"


def test_check_says_what_changed_for_an_old_style_policy_r_tls_6(tmp_path):
    """R-TLS-6: `iop-node --check` on a policy written when entries were prefixes prints one
    line naming the entries that no longer allow further arguments, and still passes."""
    config = tmp_path / "node.yaml"
    config.write_text(
        "node_id: n\nedge_url: ws://127.0.0.1:1/ws/node\ntoken: {env: IOP_TEST_NODE_TOKEN}\n"
        + OLD_STYLE_POLICY
    )
    env = os.environ | {"IOP_TEST_NODE_TOKEN": "a-node-token"}
    done = subprocess.run(
        [*node_command(config), "--check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("warning: " + WHAT_CHANGED)
    assert "These entries no longer do: claude -p." in line


@pytest.mark.slow
async def test_a_node_with_an_old_style_policy_says_what_changed_once_at_start_r_tls_6(tmp_path):
    """R-TLS-6: the running Node logs the same line once, at start, as a warning."""
    async with FakeEdge(node_payload()) as edge:
        config = write_config(tmp_path / "node.yaml", edge)
        config.write_text(config.read_text() + OLD_STYLE_POLICY)
        log_path = tmp_path / "node.log"
        env = os.environ | {"IOP_TEST_NODE_TOKEN": edge.token}
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *node_command(config), cwd=ROOT, env=env, stdout=log_file, stderr=log_file
            )
            try:
                await edge.next_connection(within=30)
                proc.send_signal(signal.SIGTERM)
                async with asyncio.timeout(20):
                    await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    lines = [line for line in log_path.read_text().splitlines() if WHAT_CHANGED in line]
    assert len(lines) == 1 and " WARNING iop_node " in lines[0]
