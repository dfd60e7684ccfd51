"""The coding agents people use, against a real Edge (R-CLIENT-1): the stack they meet (a
translated and a native group for each), their recorded requests (``tests/fixtures/clients``),
and how each CLI is pointed at the Edge (docs/journeys.md, "Coding agents")."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.processes import ROOT
from tests.support.stack import Stack
from tests.support.translation import PROFILES, PROVIDERS, translation_stack

FIXTURES = ROOT / "tests" / "fixtures" / "clients"
BIN = ROOT / "var" / "clients" / "node_modules" / ".bin"  # scripts/install-clients.sh
INSTALL = ROOT / "scripts" / "install-clients.sh"
RUN_TIMEOUT_S = 180

CLIENT_PROVIDERS = [
    *PROVIDERS,
    {"id": "p-qwen", "profile": "vllm_qwen", "base_url": "{up:main}/v1", "capacity": 4},
    {
        "id": "p-glm-coding",
        "profile": "glm_coding",
        "base_url": "{up:main}/api/coding/paas/v4",
        "capacity": 4,
    },
]
CLIENT_PROFILES = {
    **PROFILES,
    # A vLLM box serving Qwen: Chat Completions only, reasoning by its chat template's switch.
    "vllm_qwen": {
        "base": "openai",
        "operations": {"models": "/models", "chat_completions": "/chat/completions"},
        "capabilities": ["models", "chat", "streaming", "tool_calling"],
        "extensions": {"thinking": "enable_thinking"},
    },
}
CLIENT_MODELS = [
    {"id": "claude-over-chat", "providers": {"p-chat": "served-gpt"}, "translate": True},
    {
        "id": "claude-strict",
        "providers": {"p-chat": "served-gpt"},
        "translate": {"unsupported": "refuse"},
    },
    {"id": "claude-native", "providers": {"p-claude": "claude-served"}},
    {"id": "codex-over-glm", "providers": {"p-glm": "glm-4.6"}, "translate": True},
    {"id": "codex-over-qwen", "providers": {"p-qwen": "qwen3"}, "translate": True},
    {"id": "codex-native", "providers": {"p-chat": "served-gpt"}},
    # docs/journeys.md, "Coding agents": one translated group for both CLIs (GLM Coding Plan)
    {"id": "coding", "providers": {"p-glm-coding": "glm-4.6"}, "translate": True},
]


def clients_stack(directory: Path) -> Stack:
    """Not started: use it as a context manager. The Edge logs one line per request."""
    return translation_stack(
        directory,
        providers=CLIENT_PROVIDERS,
        models=CLIENT_MODELS,
        profiles=CLIENT_PROFILES,
        env={"IOP_ACCESS_LOG": "1"},
    )


@dataclass(frozen=True)
class Recorded:
    """One request as the client sent it (its prose replaced by placeholder text)."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]

    def to(self, stack: Stack, model: str) -> tuple[str, dict[str, str], bytes]:
        """(url, headers, body) of this request sent to ``stack`` for ``model``, with the
        stack's token in place of the recorded placeholder."""
        headers = dict(self.headers)
        for name in ("x-api-key", "authorization"):
            if name in headers:
                headers[name] = headers[name].replace("sk-client-fixture", stack.token)
        body = {**self.body, "model": model}
        return stack.openai_url + self.path, headers, json.dumps(body).encode()


def recorded(client: str) -> list[Recorded]:
    """The requests of ``claude-code`` or ``codex``, as recorded (tests/fixtures/clients)."""
    doc = json.loads((FIXTURES / f"{client}.json").read_text())
    return [Recorded(r["method"], r["path"], r["headers"], r["body"]) for r in doc["requests"]]


def installed() -> str | None:
    """None when both CLIs can run; else why not (the tests skip with it)."""
    if not (BIN / "claude").exists() or not (BIN / "codex").exists():
        done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True)
        if done.returncode != 0:
            return "the coding-agent CLIs are not installed: " + (done.stderr.strip()[-300:])
    return None


def claude_env(home: Path, base_url: str, token: str, model: str) -> dict[str, str]:
    """Claude Code pointed at the Edge (docs/journeys.md): its own key variable carries the
    Edge's principal token."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": token,
        "ANTHROPIC_MODEL": model,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }


CODEX_CONFIG = """model = "{model}"
model_provider = "iop"

[model_providers.iop]
name = "IOP Edge"
base_url = "{base_url}/v1"
env_key = "IOP_EDGE_TOKEN"
wire_api = "responses"
"""


def codex_env(home: Path, base_url: str, token: str, model: str) -> dict[str, str]:
    """The Codex CLI pointed at the Edge (docs/journeys.md): a provider in its config file
    whose key comes from ``IOP_EDGE_TOKEN``."""
    (home / ".codex").mkdir(parents=True, exist_ok=True)
    config = CODEX_CONFIG.format(model=model, base_url=base_url)
    (home / ".codex" / "config.toml").write_text(config)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "IOP_EDGE_TOKEN": token,
    }


def run_claude(home: Path, stack: Stack, model: str, prompt: str) -> subprocess.CompletedProcess:
    env = claude_env(home, stack.openai_url, stack.token, model)
    argv = [str(BIN / "claude"), "-p", prompt, "--output-format", "json"]
    return subprocess.run(
        argv, env=env, cwd=home, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def run_codex(home: Path, stack: Stack, model: str, prompt: str) -> subprocess.CompletedProcess:
    env = codex_env(home, stack.openai_url, stack.token, model)
    argv = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "--sandbox", "read-only", prompt]
    return subprocess.run(
        argv, env=env, cwd=home, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
