"""The usage meter on its own: labels, attribution, bounds and the flush task (no database)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import yaml
from django.core.exceptions import ImproperlyConfigured
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from catalog.config import EdgeSnapshot, load_snapshot
from iop_site.env import env_int
from pool.metering import UsageMeter, usage_retention_days
from pool.metering.pending import Counts, UsageKey
from tests.support.metering import record_factory

NOW = 1_760_000_000.0  # 2025-10-09 08:53:20 UTC; its hour bucket starts at 08:00:
HOUR = 1_759_996_800

CONFIG = """
edge: {id: edge-test, listen: 127.0.0.1:17700}
admin: {listen: 127.0.0.1:17701}
openai:
  listen: 127.0.0.1:18080
  principal_tokens:
    - {token_ref: app-notebook, principal_ref: team-research,
       token_hash_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08}
    - {token_ref: app-ci, principal_ref: team-research,
       token_hash_sha256: 60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752}
    - {token_ref: app-ops, principal_ref: team-ops,
       token_hash_sha256: fd61a03af4f77d870fc21e05e7e80678095c92d808cfb3b5c279ee04c74aca13}
nodes:
  - id: node-a
    token_hash_sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae
    providers:
      - {id: vllm-local, profile: openai, base_url: "http://127.0.0.1:8000/v1", capacity: 2}
      - {id: ollama-local, profile: ollama, base_url: "http://127.0.0.1:11434", capacity: 1}
      - {id: glm-general, profile: glm, credential: {env: IOP_TEST_ZAI_KEY}, capacity: 2}
      - {id: glm-coding, profile: glm_coding, credential: {env: IOP_TEST_ZAI_CODING}, capacity: 1}
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


def config(**changes: Any) -> EdgeSnapshot:
    document = yaml.safe_load(CONFIG)
    for model in document["models"]:
        if model["id"] in changes:
            model["usage_attribution"] = changes[model["id"]]
    return load_snapshot(document)


record = record_factory(input_tokens=12, output_tokens=30, duration_s=0.25, stream=False)


class Writes:
    """A writer that keeps every batch and wakes a waiter (called from a worker thread)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.batches: list[tuple[dict[UsageKey, tuple[int, ...]], Any]] = []
        self.written = threading.Event()
        self.fail_first = fail_first

    def __call__(self, batch: dict[UsageKey, Counts], prune_before: Any) -> int:
        if self.fail_first:
            self.fail_first -= 1
            raise OSError("database is unreachable")
        self.batches.append(({k: v.as_tuple() for k, v in batch.items()}, prune_before))
        self.written.set()
        return len(batch)

    async def wait(self) -> None:
        assert await asyncio.to_thread(self.written.wait, 5.0), "no batch was written"


def make_meter(snapshot: EdgeSnapshot | None = None, **kwargs: Any) -> tuple[UsageMeter, Writes]:
    active = snapshot or config()
    writes = kwargs.pop("writer", None) or Writes()
    kwargs.setdefault("retention_days", 0)
    meter = UsageMeter(lambda: active, writer=writes, clock=lambda: NOW, **kwargs)
    return meter, writes


def samples(meter: UsageMeter, name: str) -> dict[frozenset[tuple[str, str]], float]:
    text = generate_latest(meter.registry).decode()
    return {
        frozenset(sample.labels.items()): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def tokens(direction: str, attributed_to: str, attribution: str, **labels: str) -> frozenset:
    base = {
        "direction": direction,
        "principal_ref": "team-research",
        "token_ref": "app-notebook",
        "model_group": "qwen-local",
        "attributed_to": attributed_to,
        "attribution": attribution,
        "estimated": "false",
    }
    base.update(labels)
    return frozenset(base.items())


def test_provider_attribution_counts_tokens_under_each_serving_provider() -> None:
    """R-CFG-4: omitted usage_attribution means provider."""
    meter, _ = make_meter()
    meter.record(record(provider_id="vllm-local", input_tokens=10, output_tokens=20))
    meter.record(record(provider_id="ollama-local", input_tokens=3, output_tokens=4))
    got = samples(meter, "iop_tokens_total")
    assert got == {
        tokens("in", "vllm-local", "provider"): 10,
        tokens("out", "vllm-local", "provider"): 20,
        tokens("in", "ollama-local", "provider"): 3,
        tokens("out", "ollama-local", "provider"): 4,
    }


def test_model_group_attribution_counts_tokens_under_the_group() -> None:
    """R-CFG-4: model_group is the operator's opt-in; every provider's usage goes to the group."""
    meter, _ = make_meter()
    meter.record(record(model_group="qwen-pooled", provider_id="vllm-local", input_tokens=10))
    meter.record(record(model_group="qwen-pooled", provider_id="ollama-local", input_tokens=5))
    got = samples(meter, "iop_tokens_total")
    group = {"model_group": "qwen-pooled"}
    assert got == {
        tokens("in", "qwen-pooled", "model_group", **group): 15,
        tokens("out", "qwen-pooled", "model_group", **group): 60,
    }


def test_glm_general_and_coding_plan_usage_stays_separate() -> None:
    """R-PROF-7b: separate provider ids give separate usage figures."""
    meter, _ = make_meter()
    meter.record(record(model_group="glm-4.6", provider_id="glm-general", input_tokens=7))
    meter.record(record(model_group="glm-4.6-coding", provider_id="glm-coding", input_tokens=9))
    got = samples(meter, "iop_tokens_total")
    general = tokens("in", "glm-general", "provider", model_group="glm-4.6")
    coding = tokens("in", "glm-coding", "provider", model_group="glm-4.6-coding")
    assert got[general] == 7
    assert got[coding] == 9


def test_attribution_change_applies_to_the_next_request() -> None:
    """R-CFG-4: a usage_attribution change is live; the meter reads the active snapshot."""
    active = {"snapshot": config()}
    meter = UsageMeter(lambda: active["snapshot"], writer=Writes(), retention_days=0)
    meter.record(record(input_tokens=1, output_tokens=0))
    active["snapshot"] = config(**{"qwen-local": "model_group"})
    meter.record(record(input_tokens=2, output_tokens=0))
    got = samples(meter, "iop_tokens_total")
    assert got[tokens("in", "vllm-local", "provider")] == 1
    assert got[tokens("in", "qwen-local", "model_group")] == 2


def test_estimated_figures_are_labelled_and_kept_apart() -> None:
    meter, _ = make_meter()
    meter.record(record(input_tokens=100, output_tokens=0, estimated=True))
    meter.record(record(input_tokens=40, output_tokens=0, estimated=False))
    got = samples(meter, "iop_tokens_total")
    assert got[tokens("in", "vllm-local", "provider", estimated="true")] == 100
    assert got[tokens("in", "vllm-local", "provider", estimated="false")] == 40
    flags = {key.estimated for key in meter.pending.take()}
    assert flags == {True, False}


def test_requests_counter_labels_ok_and_error_codes() -> None:
    meter, _ = make_meter()
    meter.record(record())
    meter.record(record(provider_id=None, status=429, code="queue_full", input_tokens=0))
    meter.record(record(status=502, code=None, output_tokens=0))
    got = samples(meter, "iop_requests_total")
    base = {"operation": "chat_completions", "model_group": "qwen-local"}
    assert got == {
        frozenset({**base, "provider": "vllm-local", "code": "ok"}.items()): 1,
        frozenset({**base, "provider": "-", "code": "queue_full"}.items()): 1,
        frozenset({**base, "provider": "vllm-local", "code": "http_502"}.items()): 1,
    }
    errors = sum(counts.errors for counts in meter.pending.take().values())
    assert errors == 2


def test_duration_histogram_observes_each_request() -> None:
    meter, _ = make_meter()
    meter.record(record(duration_s=0.3))
    meter.record(record(duration_s=7.0, operation="messages"))
    counts = samples(meter, "iop_request_duration_seconds_count")
    sums = samples(meter, "iop_request_duration_seconds_sum")
    group = {"model_group": "qwen-local", "provider": "vllm-local"}
    chat = frozenset({"operation": "chat_completions", **group}.items())
    messages = frozenset({"operation": "messages", **group}.items())
    assert counts == {chat: 1, messages: 1}
    assert sums[messages] == pytest.approx(7.0)


def test_values_that_are_not_configured_ids_or_refs_become_dash() -> None:
    """Labels hold only configured ids and refs: a raw token or caller string never gets in."""
    meter, _ = make_meter()
    raw = "sk-live-RAWTOKEN-1234567890"
    meter.record(
        record(model_group="gpt-made-up", provider_id=raw, token_ref=raw, principal_ref=raw)
    )
    meter.record(record(provider_id="glm-general", token_ref=raw, principal_ref=raw))
    text = generate_latest(meter.registry).decode()
    assert raw not in text
    got = samples(meter, "iop_tokens_total")
    unknown_group = {"model_group": "-", "principal_ref": "-", "token_ref": "-"}
    assert got[tokens("in", "-", "-", **unknown_group)] == 12
    # A provider outside the model's group is not a label value either.
    assert got[tokens("in", "-", "provider", principal_ref="-", token_ref="-")] == 12
    keys = set(meter.pending.take())
    assert all(raw not in str(key) for key in keys)


def test_principal_ref_comes_from_the_token_entry() -> None:
    """R-AUTH-1, R-CFG-12: token_ref is the unit of breakdown; its principal is the config's."""
    meter, _ = make_meter()
    meter.record(record(token_ref="app-ops", principal_ref="team-research", input_tokens=5))
    meter.record(record(token_ref="app-ci", principal_ref=None, input_tokens=6))
    meter.record(record(token_ref=None, principal_ref=None, input_tokens=8))  # legacy bearer
    got = samples(meter, "iop_tokens_total")
    ops = tokens("in", "vllm-local", "provider", principal_ref="team-ops", token_ref="app-ops")
    assert got[ops] == 5
    assert got[tokens("in", "vllm-local", "provider", token_ref="app-ci")] == 6
    assert got[tokens("in", "vllm-local", "provider", principal_ref="-", token_ref="-")] == 8


def test_operation_and_code_labels_are_bounded() -> None:
    meter, _ = make_meter()
    meter.record(record(operation="Chat Completions!"))
    for n in range(80):
        meter.record(record(status=500, code=f"code_{n}"))
    codes = {dict(labels)["code"] for labels in samples(meter, "iop_requests_total")}
    operations = {dict(labels)["operation"] for labels in samples(meter, "iop_requests_total")}
    assert "-" in operations
    assert "other" in codes
    assert len(codes) == 64 + 2  # the first 64 codes, "other" and "ok"


def test_pending_map_is_bounded_and_keeps_totals() -> None:
    meter, _ = make_meter(max_pending_keys=2)
    refs = ["app-notebook", "app-ci", "app-ops"]
    for n in range(9):
        meter.record(record(token_ref=refs[n % 3], model_group=["qwen-local", "glm-4.6"][n % 2],
                            provider_id=None, input_tokens=1, output_tokens=0))  # fmt: skip
    assert len(meter.pending) <= 2 + 1  # the cap plus the hour's collapsed key
    (overflow,) = samples(meter, "iop_usage_overflow_total").values()
    batch = meter.pending.take()
    assert sum(c.requests for c in batch.values()) == 9
    assert sum(c.input_tokens for c in batch.values()) == 9
    collapsed = [k for k in batch if k.token_ref == "-" and k.model_group == "-"]
    assert batch[collapsed[0]].requests == overflow > 0


def test_record_without_a_running_loop_only_accumulates() -> None:
    meter, writes = make_meter()
    meter.record(record())
    assert len(meter.pending) == 1
    assert writes.batches == []


async def test_pending_usage_is_written_by_the_periodic_task() -> None:
    meter, writes = make_meter(flush_interval_s=0.05)
    meter.record(record())
    meter.record(record(input_tokens=8, output_tokens=2))
    await writes.wait()
    (batch, _prune), *_ = writes.batches
    key = UsageKey(HOUR, "team-research", "app-notebook", "qwen-local", "vllm-local",
                   "provider", False)  # fmt: skip
    assert batch == {key: (2, 0, 20, 32, 0, 0)}  # no cached tokens, no price: cost 0
    await meter.aclose()


async def test_a_full_pending_map_flushes_early() -> None:
    meter, writes = make_meter(flush_interval_s=60.0, max_pending_keys=2)
    meter.record(record(token_ref="app-notebook"))
    assert not writes.written.is_set()
    meter.record(record(token_ref="app-ci"))
    await writes.wait()  # long before the 60 s interval
    assert sum(len(batch) for batch, _ in writes.batches) == 2
    await meter.aclose()


async def test_start_is_idempotent_and_aclose_stops_the_task() -> None:
    meter, _ = make_meter()
    meter.start()
    task = meter._task
    meter.start()
    meter.record(record())
    assert meter._task is task and task is not None and not task.done()
    await meter.aclose()
    assert task.done()
    meter.record(record())
    assert meter._task is None  # closed: no new task


async def test_aclose_writes_what_is_pending() -> None:
    meter, writes = make_meter(flush_interval_s=60.0)
    meter.record(record())
    await meter.aclose()
    assert len(writes.batches) == 1
    assert len(meter.pending) == 0


async def test_a_failed_write_keeps_the_batch_for_the_next_flush() -> None:
    writes = Writes(fail_first=1)
    meter, _ = make_meter(flush_interval_s=60.0, writer=writes)
    meter.record(record())
    assert await meter.flush() == 0
    assert len(meter.pending) == 1
    assert await meter.flush() == 1
    (batch, _), *_ = writes.batches
    assert list(batch.values()) == [(1, 0, 12, 30, 0, 0)]
    assert list(samples(meter, "iop_usage_flush_failures_total").values()) == [1]
    await meter.aclose()


async def test_retention_is_applied_by_the_first_write_then_once_a_day() -> None:
    meter, writes = make_meter(flush_interval_s=60.0, retention_days=30)
    meter.record(record())
    await meter.flush()
    meter.record(record())
    await meter.flush()
    (_, first_prune), (_, second_prune) = writes.batches
    assert first_prune is not None
    assert first_prune.timestamp() == NOW - 30 * 86400
    assert second_prune is None
    await meter.aclose()


def test_retention_days_setting(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """The environment is read once, by the settings module; the meter reads the setting."""
    monkeypatch.delenv("IOP_USAGE_RETENTION_DAYS", raising=False)
    assert env_int("IOP_USAGE_RETENTION_DAYS", 90) == 90
    monkeypatch.setenv("IOP_USAGE_RETENTION_DAYS", "0")
    assert env_int("IOP_USAGE_RETENTION_DAYS", 90) == 0
    monkeypatch.setenv("IOP_USAGE_RETENTION_DAYS", "soon")
    with pytest.raises(ImproperlyConfigured, match="IOP_USAGE_RETENTION_DAYS"):
        env_int("IOP_USAGE_RETENTION_DAYS", 90)
    monkeypatch.setenv("IOP_USAGE_RETENTION_DAYS", "-1")
    with pytest.raises(ImproperlyConfigured):
        env_int("IOP_USAGE_RETENTION_DAYS", 90)
    settings.IOP_USAGE_RETENTION_DAYS = 14
    assert usage_retention_days() == 14
    settings.IOP_USAGE_RETENTION_DAYS = 0
    assert usage_retention_days() == 0
    settings.IOP_USAGE_RETENTION_DAYS = -1
    with pytest.raises(ImproperlyConfigured, match="IOP_USAGE_RETENTION_DAYS"):
        usage_retention_days()
