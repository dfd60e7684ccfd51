"""Active probes on a real Node agent against fake upstreams and a fake Edge (R-HEALTH-3):
the ``models`` operation or a cli provider's ``probe_command``, reported as probe_result,
bounded by a timeout, never counted as a run."""

from __future__ import annotations

import asyncio
import math
import sys

import pytest

from nodes import wire
from tests.fakes import CLI_TOOL, FakeOpenAI
from tests.fakes.edge import FakeEdge
from tests.support.node_agent import running_node
from tests.support.payloads import cli_provider, node_payload, openai_provider
from tests.support.pids import reaped, wait_exit
from tests.support.processes import free_port

PROBE = {"probe_interval_s": 0.05, "first_byte_timeout_s": 2.0}


@pytest.fixture
async def upstream():
    async with FakeOpenAI() as server:
        yield server


async def first_result(payload: wire.NodePayload, tmp_path) -> wire.ProbeResult:  # type: ignore[no-untyped-def]
    async with FakeEdge(payload) as edge, running_node(edge, tmp_path) as node:
        conn = await edge.next_connection()
        result = await conn.next_of(wire.ProbeResult)
        assert node.registries.current is not None and node.registries.current.active == 0
    assert isinstance(result, wire.ProbeResult)
    return result


async def test_a_healthy_upstream_is_probed_with_its_models_operation_r_health_3(
    upstream, tmp_path
):
    provider = openai_provider(upstream.url, pid="p", **PROBE)
    result = await first_result(node_payload(provider), tmp_path)
    assert (result.provider_id, result.ok, result.reason) == ("p", True, "")
    assert [(r.method, r.path) for r in upstream.requests][:1] == [("GET", "/v1/models")]


async def test_an_upstream_answering_503_fails_the_probe_r_health_3(upstream, tmp_path):
    upstream.faults.status = 503
    provider = openai_provider(upstream.url, pid="p", **PROBE)
    result = await first_result(node_payload(provider), tmp_path)
    assert (result.ok, result.reason) == (False, "upstream answered HTTP 503")


@pytest.mark.parametrize("status", [401, 403])
async def test_a_probe_without_a_credential_takes_401_or_403_as_reachable_r_mgd_10(
    upstream, tmp_path, status
):
    """R-MGD-10: a managed provider's probe carries no secret (the Node has none between
    runs); the upstream's 401/403 says it is there, so the probe reports it healthy."""
    upstream.faults.status = status
    provider = openai_provider(upstream.url, pid="p", auth=wire.AuthPayload(type="bearer"), **PROBE)
    result = await first_result(node_payload(provider), tmp_path)
    assert (result.ok, result.reason) == (True, "")
    assert "authorization" not in upstream.requests[0].headers


async def test_a_probe_with_a_credential_still_fails_on_401(upstream, tmp_path, monkeypatch):
    """A configured credential that the upstream refuses is a real failure (legacy mode)."""
    monkeypatch.setenv("PROBE_KEY", "sk-probe-key")
    upstream.faults.status = 401
    provider = openai_provider(
        upstream.url, pid="p", auth=wire.AuthPayload(type="bearer"),
        credential=wire.SecretRefPayload(env="PROBE_KEY"), **PROBE,
    )  # fmt: skip
    result = await first_result(node_payload(provider), tmp_path)
    assert (result.ok, result.reason) == (False, "upstream answered HTTP 401")


async def test_a_refused_connection_fails_the_probe_without_naming_the_address(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    result = await first_result(node_payload(openai_provider(url, pid="p", **PROBE)), tmp_path)
    assert (result.ok, result.reason) == (False, "cannot connect to the upstream")


async def test_a_hanging_probe_fails_at_its_timeout_and_drops_the_connection(upstream, tmp_path):
    """R-HEALTH-3: a probe is bounded by the provider's first-byte timeout."""
    upstream.faults.stall_before_first_byte = math.inf
    provider = openai_provider(
        upstream.url, pid="p", probe_interval_s=0.05, first_byte_timeout_s=0.3
    )
    async with FakeEdge(node_payload(provider)) as edge, running_node(edge, tmp_path):
        conn = await edge.next_connection()
        result = await conn.next_of(wire.ProbeResult)
        assert isinstance(result, wire.ProbeResult)
        assert (result.ok, result.reason) == (False, "no answer within 0.3 s")
        async with asyncio.timeout(5):  # while the Node still runs: the probe left
            await upstream.disconnected.wait()


async def test_a_cli_provider_is_probed_with_its_probe_command(tmp_path):
    ok = cli_provider("echo", pid="c", probe_command=[sys.executable, "-c", "pass"], **PROBE)
    assert (await first_result(node_payload(ok), tmp_path)).ok
    failing = cli_provider(
        "echo", pid="c", probe_command=[sys.executable, CLI_TOOL, "fail", "3"], **PROBE
    )
    result = await first_result(node_payload(failing), tmp_path)
    assert (result.ok, result.reason) == (False, "probe command exited with code 3")


async def test_a_hanging_probe_command_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "pids"
    hang = cli_provider(
        "echo",
        pid="c",
        probe_command=[sys.executable, CLI_TOOL, "hang", str(pidfile)],
        probe_interval_s=0.05,
        first_byte_timeout_s=0.5,
    )
    result = await first_result(node_payload(hang), tmp_path)
    assert (result.ok, result.reason) == (False, "no answer within 0.5 s")
    parent, child = (int(pid) for pid in pidfile.read_text().split())
    await wait_exit(child)
    assert reaped(parent)
