"""Managed credential mode with real processes over TLS: a managed Edge (runedge, https and
wss) and a managed Node (iop-node), slots and routes set by the operator's commands, the
official OpenAI SDK as the caller, fake upstreams that record what they receive, and a cli
provider that records its argv and environment (R-AUTH-3..6, R-MGD-1..6, R-MGD-10, R-MGD-11).
Keys and certificates are minted in the test."""

from __future__ import annotations

import json
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.fakes import CLI_TOOL
from tests.support import Stack
from tests.support.managed import ManagedKeys, managed_stack, mint_keys
from tests.support.scale_failures import eventually
from tests.support.stack import provider_row
from tests.support.tls import Pki

pytestmark = pytest.mark.slow

SECRET = "sk-e2e-canary-4f2c9b7d1a"  # unique: searched for everywhere at the end
ROTATED = "sk-e2e-rotated-8e3a6c05"
OLLAMA_SECRET = "sk-e2e-ollama-2b7e90d4"
TOOL_SECRET = "sk-e2e-tool-c41f6a38"
NODE = "node-1"
TOOL_DUMP = "tool-env.json"


class Managed:
    """The running stack, its keys and CA, the route key and every answer body seen."""

    def __init__(self, stack: Stack, pki: Pki, keys: ManagedKeys) -> None:
        self.stack, self.pki, self.keys = stack, pki, keys
        self.key = ""
        self.answers: list[str] = []

    def sdk(self, key: str | None = None, **headers: str) -> openai.OpenAI:
        """The official SDK over https, trusting only the test CA."""
        return openai.OpenAI(
            base_url=self.stack.v1_url,
            api_key=self.key if key is None else key,
            default_headers=headers or None,
            http_client=httpx.Client(verify=ssl.create_default_context(cafile=self.pki.ca_file)),
            max_retries=0,
        )

    def chat(self, model: str = "glm", key: str | None = None, **headers: str) -> str:
        with self.sdk(key, **headers) as client:
            reply = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}]
            )
        text = reply.model_dump_json()
        self.answers.append(text)
        return text

    def refused(self, model: str = "glm", key: str | None = None, **headers: str) -> Any:
        with pytest.raises(openai.APIStatusError) as info:
            self.chat(model, key, **headers)
        self.answers.append(info.value.response.text)
        return info.value

    def table_version(self) -> str:
        return str(self.stack.pool_snapshot()["credential_table"]["version"])

    def changing(self, *args: str, stdin: bytes = b"") -> str:
        """A command that changes routes or slots (another process), then wait until the
        Edge's route table has followed it (R-MGD-12: within IOP_REVISION_POLL_S)."""
        before = self.table_version()
        out = self.stack.manage(*args, stdin=stdin)
        self.stack.wait_until(
            lambda snap: snap["credential_table"]["version"] != before, what="the route table"
        )
        return out

    def upstream_auth(self) -> list[str]:
        return [r.headers.get("authorization", "") for r in self.stack.upstream().server.requests]


@pytest.fixture(scope="module")
def managed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Managed]:
    directory = tmp_path_factory.mktemp("managed")
    pki = Pki(directory / "pki")
    keys = mint_keys(directory / "keys", NODE)
    # R-MGD-11: an Ollama behind an authenticating proxy, and a cli program; R-MGD-10: a
    # provider probed without a credential by an upstream that answers 401 to everything.
    extra = [
        {"id": "ollama-1", "profile": "ollama", "base_url": "{up:ollama}"},
        {"id": "tool-1", "profile": "cli", "credential_env": "TOOL_API_KEY",
         "command": [sys.executable, CLI_TOOL, "envdump", str(directory / TOOL_DUMP)]},
        {"id": "glm-probed", "profile": "glm", "base_url": "{up:deny}/v1", "probe_interval_s": 1},
    ]  # fmt: skip
    stack = managed_stack(
        directory,
        pki,
        keys,
        extra_providers=extra,
        extra_models=[
            {"id": "local", "providers": {"ollama-1": "llama3"}},
            {"id": "tool", "providers": {"tool-1": "tool"}},
        ],
        upstreams={"main": "openai", "ollama": "ollama", "deny": "openai"},
        log_level="DEBUG",  # the canary must not show up even at the most verbose level
    )
    with stack:
        env = Managed(stack, pki, keys)
        env.changing("iop_slot", "set", "glm-main", "--profile", "glm", stdin=SECRET.encode())
        out = env.changing(
            "iop_route", "create", "team-a", "--model", "glm", "--slot", "glm=glm-main", "--json"
        )
        env.key = json.loads(out)["key"]
        yield env


def test_a_route_key_calls_a_model_and_the_upstream_gets_exactly_the_slot_secret_r_mgd_4(
    managed: Managed,
):
    """R-MGD-3, R-MGD-4: https caller with a route key, Node over wss, the slot secret
    delivered in a lease envelope and sent upstream as the profile's bearer credential."""
    managed.stack.reset_upstreams()
    reply = json.loads(managed.chat())
    assert reply["choices"][0]["message"]["content"]
    assert managed.upstream_auth() == [f"Bearer {SECRET}"]
    managed.stack.wait_idle()


def test_a_rotated_slot_and_keyring_are_used_by_the_next_request_without_restart_r_mgd_2(
    managed: Managed,
):
    """R-MGD-2, R-MGD-12: a new slot secret, then a keyring rotation (every slot re-sealed
    under a new key), each used by the same Edge process once its route table followed the
    change (within IOP_REVISION_POLL_S), without a restart."""
    stack = managed.stack
    assert stack.edge is not None
    pid = stack.edge.popen.pid
    stack.reset_upstreams()
    managed.changing("iop_slot", "set", "glm-main", "--profile", "glm", stdin=ROTATED.encode())
    managed.chat()
    managed.changing("iop_keyring", "rotate", "--key-id", "k2")
    managed.chat()
    managed.changing("iop_slot", "set", "glm-main", "--profile", "glm", stdin=SECRET.encode())
    managed.chat()
    assert managed.upstream_auth() == [f"Bearer {ROTATED}", f"Bearer {ROTATED}", f"Bearer {SECRET}"]
    assert stack.edge.popen.pid == pid and stack.edge.alive()  # the same process throughout
    stack.wait_idle()


def test_callers_outside_their_route_are_refused_and_nothing_leaks_r_auth_5_r_mgd_5(
    managed: Managed,
):
    """R-AUTH-5, R-MGD-9: another model group is 404 model_not_found (as for a principal
    token's scope); R-MGD-5: a caller-supplied provider credential; an unknown key. None
    reaches the upstream; every counter is back to zero."""
    managed.stack.reset_upstreams()
    other = managed.refused(model="coder")
    assert other.status_code == 404 and other.body["code"] == "model_not_found"
    forwarded = managed.refused(**{"X-IOP-Provider-Authorization": "Bearer sk-caller"})
    assert forwarded.status_code == 400 and forwarded.body["code"] == "provider_credential_refused"
    unknown = managed.refused(key="iop_route_unknown")
    assert unknown.status_code == 401 and unknown.body["code"] == "invalid_api_key"
    assert managed.upstream_auth() == []
    managed.stack.wait_idle()


def test_routes_with_an_unknown_slot_or_a_slot_of_the_other_glm_family_are_refused_r_mgd_6(
    managed: Managed,
):
    """R-MGD-6: a GLM General slot can never serve the GLM Coding Plan provider."""
    with pytest.raises(RuntimeError, match="unknown slot 'nope'"):
        managed.stack.manage(
            "iop_route", "create", "r1", "--model", "coder", "--slot", "glm-coding=nope"
        )
    with pytest.raises(RuntimeError, match="slot 'glm-main' is for profile family 'glm'"):
        managed.stack.manage(
            "iop_route", "create", "r2", "--model", "coder", "--slot", "glm-coding=glm-main"
        )


def test_a_slot_under_a_key_missing_from_the_keyring_or_a_corrupted_keyring_fails_clearly(
    managed: Managed, tmp_path: Path
):
    """A slot sealed under a key id the keyring file does not hold (here: sealed with another
    keyring), then the same with the keyring file corrupted: each request is 503
    credential_unavailable, the Edge log names the slot and key id, then the file (never a
    secret); nothing reaches the upstream, every lease is back. Sealing it again under the
    real keyring heals it."""
    stack = managed.stack
    keyring = managed.keys.directory.parent / "keyring.json"
    stray = tmp_path / "stray-keyring.json"
    stack.manage("iop_keyring", "init", str(stray), "--key-id", "k9")
    set_slot = ("iop_slot", "set", "glm-main", "--profile", "glm")
    managed.changing(*set_slot, "--keyring", str(stray), stdin=SECRET.encode())
    good = keyring.read_text()
    stack.reset_upstreams()
    try:
        lost = managed.refused()
        assert lost.status_code == 503 and lost.body["code"] == "credential_unavailable"
        assert "'glm-main'" in lost.body["message"]
        keyring.write_text("{not json")
        managed.changing(*set_slot, "--keyring", str(stray), stdin=SECRET.encode())
        corrupt = managed.refused()
        assert corrupt.status_code == 503 and corrupt.body["code"] == "credential_unavailable"
    finally:
        keyring.write_text(good)
    assert stack.edge is not None
    log = stack.edge.log.read_text()
    assert "slot 'glm-main' is sealed under key 'k9', not in the keyring" in log
    assert f"the keyring file {keyring} is not a JSON object" in log
    assert managed.upstream_auth() == []
    stack.wait_idle()
    managed.changing(*set_slot, stdin=SECRET.encode())
    managed.chat()
    assert managed.upstream_auth() == [f"Bearer {SECRET}"]
    stack.wait_idle()


def test_a_route_key_lists_only_its_model_group_r_mgd_9(managed: Managed):
    """R-MGD-9: through the official SDK, /v1/models lists the route's group only and
    another group's entry is 404 model_not_found."""
    with managed.sdk() as client:
        assert [m.id for m in client.models.list()] == ["glm"]
        assert client.models.retrieve("glm").id == "glm"
        with pytest.raises(openai.NotFoundError) as info:
            client.models.retrieve("coder")
    assert info.value.body["code"] == "model_not_found"


def test_moved_key_files_and_an_unrelated_apply_leave_requests_working_r_mgd_7(
    managed: Managed,
):
    """R-MGD-7: the key files and the keyring are read once at start: with all of them moved
    away, an apply of an unrelated live change and the requests after it still succeed."""
    stack = managed.stack
    keys = managed.keys.directory
    moved = keys.with_name("keys-moved")
    keys.rename(moved)
    try:
        document = yaml.safe_load(stack.config_path.read_text())
        document["provider_pool"]["max_queue"] = 15  # unrelated to credentials, live
        status, report = stack.refresh("apply", document)
        assert status == 200 and report["applied"] is True, report
        stack.reset_upstreams()
        managed.chat()
        managed.chat()
        assert managed.upstream_auth() == [f"Bearer {SECRET}"] * 2
    finally:
        moved.rename(keys)
        document["provider_pool"]["max_queue"] = 16
        assert stack.refresh("apply", document)[0] == 200
    stack.wait_idle()


def test_the_slot_secret_appears_nowhere_on_edge_or_node_r_auth_6(managed: Managed):
    """R-AUTH-6, R-MGD-2: after calls, rotations and refusals, the canary secrets are in no
    log (Edge and Node, DEBUG), metric, response, refresh report, config export or
    database dump."""
    stack = managed.stack
    managed.chat()
    document = yaml.safe_load(stack.config_path.read_text())
    status, report = stack.refresh("dry_run", document)
    assert status == 200, report
    places = {
        "logs": stack.logs(),
        "metrics": stack.metrics_text(),
        "responses": "\n".join(managed.answers),
        "refresh report": json.dumps(report),
        "config export": stack.manage("iop_config", "export"),
        "dumpdata": stack.manage("dumpdata"),
    }
    assert "glm-main" in places["dumpdata"]  # the dump did include the slot table
    for where, text in places.items():
        for secret in (SECRET, ROTATED, OLLAMA_SECRET, TOOL_SECRET):
            assert secret not in text, f"a slot secret appears in the {where}"
    stack.wait_idle()


def test_managed_mode_refuses_to_start_without_tls_or_with_an_unreadable_key_r_mgd_5(
    tmp_path: Path, managed: Managed
):
    """R-MGD-5, R-AUTH-3: no TLS on the Node listener or the OpenAI listener is refused at
    load; a key file that does not parse stops runedge naming the file."""
    document = yaml.safe_load(managed.stack.config_path.read_text())
    del document["edge"]["tls"], document["openai"]["tls"]
    bad = tmp_path / "edge.yaml"
    bad.write_text(yaml.safe_dump(document))
    with pytest.raises(RuntimeError) as info:
        managed.stack.manage("iop_config", "validate", str(bad))
    assert "edge.tls: is required when credential_plane.enabled" in str(info.value)
    assert "openai.tls: is required when credential_plane.enabled" in str(info.value)


def _route(managed: Managed, route: str, model: str, binding: str) -> str:
    out = managed.changing(  # R-MGD-12: in force once the Edge's route table has it
        "iop_route", "create", route, "--model", model, "--slot", binding, "--json"
    )
    return str(json.loads(out)["key"])


def test_an_ollama_provider_gets_its_slot_secret_as_its_auth_header_r_mgd_11(managed: Managed):
    """R-MGD-11: the built-in ollama profile sends no credential of its own; a managed run's
    slot secret goes upstream as `Authorization: Bearer`, for that run only."""
    stack = managed.stack
    managed.changing("iop_slot", "set", "ollama-main", "--profile", "ollama",
                     stdin=OLLAMA_SECRET.encode())  # fmt: skip
    key = _route(managed, "team-local", "local", "ollama-1=ollama-main")
    stack.reset_upstreams()
    reply = json.loads(managed.chat(model="local", key=key))
    assert reply["choices"][0]["message"]["content"]
    (request,) = stack.upstream("ollama").server.requests
    assert request.path == "/api/chat"
    assert request.headers.get("authorization") == f"Bearer {OLLAMA_SECRET}"
    stack.wait_idle()


def test_a_cli_provider_gets_its_slot_secret_in_its_named_environment_variable_r_mgd_11(
    managed: Managed,
):
    """R-MGD-11: the slot secret reaches the program in `credential_env`, never in argv, and
    the program sees nothing else of the Node's environment (R-TLS-3)."""
    stack = managed.stack
    managed.changing("iop_slot", "set", "tool-main", "--profile", "cli", stdin=TOOL_SECRET.encode())
    key = _route(managed, "team-tool", "tool", "tool-1=tool-main")
    reply = json.loads(managed.chat(model="tool", key=key))
    assert reply["choices"][0]["message"]["content"] == "hi"
    dump = json.loads((managed.keys.directory.parent / TOOL_DUMP).read_text())
    assert dump["env"]["TOOL_API_KEY"] == TOOL_SECRET
    assert not any(TOOL_SECRET in arg for arg in dump["argv"])
    assert "IOP_NODE_TOKEN" not in dump["env"]
    stack.wait_idle()


def test_a_probe_carries_no_secret_and_a_401_means_reachable_r_mgd_10(managed: Managed):
    """R-MGD-10: a managed provider's probe has no slot secret to send; the upstream's 401
    says it is there, so the provider stays healthy instead of being ejected."""
    deny = managed.stack.upstream("deny").server
    deny.faults.status = 401  # every answer from now on; eject_after_failures is 3

    def refused() -> list[Any]:
        return [r for r in deny.requests if r.status == 401]

    eventually(lambda: len(refused()) >= 4, "four probes answered 401")
    assert {(r.method, r.path) for r in deny.requests} == {("GET", "/v1/models")}
    assert all("authorization" not in r.headers for r in deny.requests)
    row = provider_row(managed.stack.pool_snapshot(), "glm-probed")
    assert row["health"] == "healthy", row
