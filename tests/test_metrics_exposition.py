"""GET /metrics: Prometheus text with request, token and pool figures; never a secret."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from asgiref.sync import sync_to_async
from django.db import connections
from prometheus_client.parser import text_string_to_metric_families

from catalog.config import load_snapshot
from iop_site.control import ControlApp
from iop_site.runtime import EdgeRuntime
from pool.http.metrics import metrics_response, scrape_allowed
from pool.models import UsageBucket
from tests.support.clock import Clock
from tests.support.metering import record_factory
from tests.support.pools import enqueue

# Canary values: configured as provider credentials, caller tokens and the scrape token.
CANARIES = {
    "IOP_TEST_ZAI_KEY": "zai-general-CANARY-4b1f0c9e77",
    "IOP_TEST_ZAI_CODING": "zai-coding-CANARY-93ad51e2c0",
    "IOP_TEST_BEARER": "caller-bearer-CANARY-d02c7a18",
    "IOP_TEST_METRICS": "scrape-CANARY-5e8b1d6f4a2c",
}

CONFIG = """
edge: {id: edge-test, listen: 127.0.0.1:17700}
admin: {listen: 127.0.0.1:17701}
openai:
  listen: 127.0.0.1:18080
  bearer_token: {env: IOP_TEST_BEARER}
  metrics_token: {env: IOP_TEST_METRICS}
  principal_tokens:
    - {token_ref: app-notebook, principal_ref: team-research,
       token_hash_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}
nodes:
  - id: node-a
    token_hash_sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
    providers:
      - {id: vllm-local, profile: openai, base_url: "http://127.0.0.1:8000/v1",
         capacity: 1, priority: 10}
      - {id: ollama-local, profile: ollama, base_url: "http://127.0.0.1:11434",
         capacity: 1, priority: 50}
  - id: node-b
    token_hash_sha256: fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9
    providers:
      - {id: glm-general, profile: glm, credential: {env: IOP_TEST_ZAI_KEY}, capacity: 2}
      - {id: glm-coding, profile: glm_coding, credential: {env: IOP_TEST_ZAI_CODING},
         capacity: 1}
models:
  - id: qwen-local
    providers: {vllm-local: Qwen/Qwen2.5-7B-Instruct, ollama-local: "qwen2.5:7b"}
  - id: qwen-pooled
    usage_attribution: model_group
    providers: {vllm-local: Qwen/Qwen2.5-7B-Instruct, ollama-local: "qwen2.5:7b"}
  - id: glm-4.6
    providers: {glm-general: glm-4.6}
  - id: glm-4.6-coding
    providers: {glm-coding: glm-4.6}
"""


record = record_factory(input_tokens=11, output_tokens=22, duration_s=0.2, stream=True)


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


@pytest.fixture
async def runtime(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> AsyncIterator[EdgeRuntime]:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    edge = EdgeRuntime(load_snapshot(yaml.safe_load(CONFIG)), clock=clock)
    yield edge
    edge.meter.pending.take()  # these tests check the exposition; the ledger has its own tests
    edge.meter.requests.take()
    await edge.aclose()


async def scrape(runtime: EdgeRuntime) -> tuple[int, dict[bytes, bytes], str]:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await metrics_response(runtime, send)
    start, body = messages
    return start["status"], dict(start["headers"]), body["body"].decode()


def samples(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


async def test_metrics_show_the_request_under_provider_attribution(runtime: EdgeRuntime) -> None:
    """R-CFG-4 (provider, the default) and R-PROF-7b (GLM figures stay per provider)."""
    runtime.meter.record(record())
    runtime.meter.record(record(model_group="glm-4.6", provider_id="glm-general", input_tokens=5))
    runtime.meter.record(record(model_group="glm-4.6-coding", provider_id="glm-coding",
                                input_tokens=6))  # fmt: skip
    status, headers, text = await scrape(runtime)
    assert status == 200
    assert headers[b"content-type"] == b"text/plain; version=0.0.4; charset=utf-8"
    tokens = samples(text, "iop_tokens_total")
    who = {"principal_ref": "team-research", "token_ref": "app-notebook", "estimated": "false"}
    assert tokens[labels(direction="in", model_group="qwen-local", attributed_to="vllm-local",
                         attribution="provider", **who)] == 11  # fmt: skip
    assert tokens[labels(direction="out", model_group="qwen-local", attributed_to="vllm-local",
                         attribution="provider", **who)] == 22  # fmt: skip
    assert tokens[labels(direction="in", model_group="glm-4.6", attributed_to="glm-general",
                         attribution="provider", **who)] == 5  # fmt: skip
    assert tokens[labels(direction="in", model_group="glm-4.6-coding", attributed_to="glm-coding",
                         attribution="provider", **who)] == 6  # fmt: skip
    requests = samples(text, "iop_requests_total")
    assert requests[labels(operation="chat_completions", model_group="qwen-local",
                           provider="vllm-local", code="ok")] == 1  # fmt: skip
    durations = samples(text, "iop_request_duration_seconds_count")
    assert durations[labels(operation="chat_completions", model_group="qwen-local",
                            provider="vllm-local")] == 1  # fmt: skip


async def test_metrics_show_the_request_under_model_group_attribution(
    runtime: EdgeRuntime,
) -> None:
    """R-CFG-4: with model_group attribution the group, not the provider, is attributed."""
    runtime.meter.record(record(model_group="qwen-pooled", provider_id="ollama-local",
                                estimated=True))  # fmt: skip
    _, _, text = await scrape(runtime)
    tokens = samples(text, "iop_tokens_total")
    expected = {
        labels(direction=d, principal_ref="team-research", token_ref="app-notebook",
               model_group="qwen-pooled", attributed_to="qwen-pooled",
               attribution="model_group", estimated="true"): v
        for d, v in (("in", 11), ("out", 22))
    }  # fmt: skip
    assert tokens == expected
    requests = samples(text, "iop_requests_total")
    assert requests == {labels(operation="chat_completions", model_group="qwen-pooled",
                               provider="ollama-local", code="ok"): 1}  # fmt: skip


async def test_pool_gauges_are_read_at_scrape_time(runtime: EdgeRuntime, clock: Clock) -> None:
    """R-POOL-8: per-provider in-flight, capacity, queued, online; queue depth and oldest wait."""
    pool = runtime.pool
    pool.node_ready("node-a", 1)
    first = await pool.acquire("qwen-local")
    second = await pool.acquire("qwen-local")
    waiter = await enqueue(pool, "qwen-local")
    clock.now += 2.5
    _, _, text = await scrape(runtime)

    def gauge(name: str, provider: str) -> float:
        node = "node-a" if provider in ("vllm-local", "ollama-local") else "node-b"
        return samples(text, name)[labels(node=node, provider=provider)]

    for provider in ("vllm-local", "ollama-local"):
        assert gauge("iop_provider_in_flight", provider) == 1
        assert gauge("iop_provider_capacity", provider) == 1
        assert gauge("iop_provider_queued", provider) == 1
        assert gauge("iop_provider_online", provider) == 1
        assert gauge("iop_provider_long_in_flight", provider) == 0
    assert gauge("iop_provider_online", "glm-general") == 0
    assert gauge("iop_provider_in_flight", "glm-general") == 0
    assert samples(text, "iop_queue_depth") == {frozenset(): 1}
    assert samples(text, "iop_queue_oldest_wait_seconds") == {frozenset(): 2.5}
    assert samples(text, "iop_pool_reachable") == {frozenset(): 1}  # in memory: always

    pool.release(first)
    third = await asyncio.wait_for(waiter, 5)
    pool.release(second)
    pool.release(third)
    _, _, text = await scrape(runtime)
    assert samples(text, "iop_queue_depth") == {frozenset(): 0}
    assert set(samples(text, "iop_provider_in_flight").values()) == {0}


async def test_the_admin_listener_serves_metrics_to_loopback_only(runtime: EdgeRuntime) -> None:
    runtime.meter.record(record())
    app = ControlApp(runtime)

    async def get(client: str) -> tuple[int, bytes]:
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": "/metrics", "headers": [],
                 "client": (client, 40000), "server": ("127.0.0.1", 17701)}  # fmt: skip
        await app(scope, None, send)
        return sent[0]["status"], sent[1]["body"]

    status, body = await get("127.0.0.1")
    assert status == 200 and b"iop_requests_total{" in body
    status, body = await get("203.0.113.7")
    assert status == 403 and b"iop_" not in body


def test_scrape_allowed_only_with_the_configured_token(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    edge = EdgeRuntime(load_snapshot(yaml.safe_load(CONFIG)))
    token = CANARIES["IOP_TEST_METRICS"].encode()
    assert scrape_allowed(edge, [(b"authorization", b"Bearer " + token)])
    assert scrape_allowed(edge, [(b"authorization", b"bearer " + token)])
    assert not scrape_allowed(edge, [(b"authorization", b"Bearer " + token + b"x")])
    assert not scrape_allowed(edge, [(b"authorization", b"Bearer " + token[:-1])])
    assert not scrape_allowed(edge, [(b"authorization", b"Basic " + token)])
    assert not scrape_allowed(edge, [(b"authorization", b"Bearer ")])
    assert not scrape_allowed(edge, [(b"x-metrics-token", token)])
    assert not scrape_allowed(edge, [])
    # The principal (caller) bearer token is not a scrape token.
    caller = CANARIES["IOP_TEST_BEARER"].encode()
    assert not scrape_allowed(edge, [(b"authorization", b"Bearer " + caller)])


def test_scrape_is_refused_when_no_token_is_configured_or_it_cannot_be_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    document = yaml.safe_load(CONFIG)
    del document["openai"]["metrics_token"]
    edge = EdgeRuntime(load_snapshot(document))
    assert not scrape_allowed(edge, [(b"authorization", b"Bearer anything")])
    monkeypatch.delenv("IOP_TEST_METRICS", raising=False)
    edge = EdgeRuntime(load_snapshot(yaml.safe_load(CONFIG)))
    assert not scrape_allowed(edge, [(b"authorization", b"Bearer anything")])
    assert "IOP_TEST_METRICS" in caplog.text  # the reference is named; a value never is


@pytest.mark.django_db(transaction=True)
async def test_no_secret_reaches_metrics_or_the_ledger(runtime: EdgeRuntime) -> None:
    """R-REF-6, R-AUTH-6: credentials and raw tokens never appear in metrics or usage rows."""
    runtime.pool.node_ready("node-b", 1)
    lease = await runtime.pool.acquire("glm-4.6")
    runtime.pool.release(lease)
    for secret in CANARIES.values():
        # A caller that passes raw values where refs belong gets "-", never the value.
        runtime.meter.record(record(model_group="glm-4.6", provider_id="glm-general",
                                    token_ref=secret, principal_ref=secret))  # fmt: skip
        runtime.meter.record(record(model_group=secret, provider_id=secret, operation=secret,
                                    status=500, code=secret))  # fmt: skip
    runtime.meter.record(record())
    _, _, text = await scrape(runtime)
    assert "iop_tokens_total{" in text and "glm-general" in text
    for secret in CANARIES.values():
        assert secret not in text
        assert secret.lower() not in text

    assert await runtime.meter.flush() > 0

    def ledger_text() -> str:
        try:
            return repr(list(UsageBucket.objects.values()))
        finally:
            connections.close_all()

    stored = await sync_to_async(ledger_text, thread_sensitive=False)()
    assert "glm-general" in stored
    for secret in CANARIES.values():
        assert secret not in stored and secret.lower() not in stored


DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "iop-edge.json"
_SUFFIXES = ("_bucket", "_count", "_sum", "_total")


async def test_the_grafana_dashboard_uses_only_metrics_the_edge_exposes_r_obs_3(
    runtime: EdgeRuntime,
) -> None:
    """R-OBS-3: docs/grafana/iop-edge.json is well-formed, and every metric its queries name
    is in /metrics (queue depth, in flight vs capacity, TTFT, errors by code and spend among
    them)."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {name for expr in exprs for name in re.findall(r"\biop_[a-z_]+", expr)}
    runtime.meter.record(record(ttft_s=0.3, queue_wait_s=0.01, provider_id="vllm-local"))
    _, _, text = await scrape(runtime)
    exposed = {family.name for family in text_string_to_metric_families(text)}
    bases = {next((n[: -len(s)] for s in _SUFFIXES if n.endswith(s)), n) for n in named}
    assert bases <= exposed, sorted(bases - exposed)
    for needed in ("iop_queue_depth", "iop_provider_in_flight", "iop_provider_capacity",
                   "iop_time_to_first_token_seconds", "iop_requests", "iop_spend"):  # fmt: skip
        assert needed in bases


def test_importing_the_grafana_dashboard_asks_for_its_prometheus_data_source() -> None:
    """docs/observability.md, "Grafana": the import asks for one Prometheus data source
    (``__inputs``), the ``datasource`` variable starts on it, and every panel and query
    variable reads through that variable."""
    dashboard = json.loads(DASHBOARD.read_text())
    (wanted,) = dashboard["__inputs"]
    assert (wanted["type"], wanted["pluginId"]) == ("datasource", "prometheus")
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["current"]["value"] == "${" + wanted["name"] + "}"
    users = [*dashboard["panels"], *(v for v in variables.values() if v["type"] == "query")]
    assert users and all(u["datasource"]["uid"] == "${datasource}" for u in users)
