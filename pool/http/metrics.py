"""GET /metrics: the meter's registry plus pool gauges read at scrape time (Prometheus text).

Served on the loopback control listener (``admin.listen``), and on the public listener only
to a caller that presents the configured scrape token (``openai.metrics_token``). Labels carry
ids and refs only, never a credential or raw token (R-REF-6, R-AUTH-6).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from catalog.config.secrets import SecretUnavailableError
from edgekit.http import presented_bearer
from pool.http.plane import DataPlane

logger = logging.getLogger(__name__)

HEALTH_STATES = ("healthy", "ejected", "probing")  # R-HEALTH-4
_PROVIDER_GAUGES = (
    ("iop_provider_in_flight", "Normal in-flight runs (leases) on the provider.", "in_flight"),
    ("iop_provider_long_in_flight", "Long-context in-flight runs.", "long_in_flight"),
    ("iop_provider_capacity", "Capacity of the provider as the pool reports it.", "capacity"),
    ("iop_provider_queued", "Pending requests that have the provider as a candidate.", "queued"),
    ("iop_provider_ejected_seconds", "Time left of its ejection (R-HEALTH-4).", "ejected_for_s"),
)


class PoolCollector(Collector):
    """Pool gauges from one ``pool.snapshot()`` per scrape (R-POOL-8)."""

    def __init__(self, runtime: DataPlane) -> None:
        self._runtime = runtime

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time only

    def collect(self) -> Iterator[Metric]:
        snapshot = self._runtime.pool.snapshot()
        families = {
            attr: GaugeMetricFamily(name, doc, labels=["node", "provider"])
            for name, doc, attr in _PROVIDER_GAUGES
        }
        online = GaugeMetricFamily(
            "iop_provider_online", "1 when the provider's Node is dispatch-ready.",
            labels=["node", "provider"],
        )  # fmt: skip
        health = GaugeMetricFamily(
            "iop_provider_health", "1 for the provider's health state (healthy/ejected/probing).",
            labels=["node", "provider", "state"],
        )  # fmt: skip
        for status in snapshot.providers:
            labels = [status.node_id, status.provider_id]
            for attr, family in families.items():
                family.add_metric(labels, float(getattr(status, attr)))
            online.add_metric(labels, 1.0 if status.online else 0.0)
            for state in HEALTH_STATES:
                health.add_metric([*labels, state], 1.0 if status.health == state else 0.0)
        yield from families.values()
        yield online
        yield health
        yield from self._health_counters()
        yield GaugeMetricFamily(
            "iop_queue_depth", "Requests waiting in the global queue.", value=snapshot.queue_depth
        )
        oldest_ms = snapshot.oldest_wait_ms or 0
        yield GaugeMetricFamily(
            "iop_queue_oldest_wait_seconds", "Wait so far of the oldest queued request.",
            value=oldest_ms / 1000.0,
        )  # fmt: skip
        total, largest, held = self._runtime.hub.relay_buffered()
        yield GaugeMetricFamily(
            "iop_relay_buffered_bytes",
            "Run output received from Nodes and not yet taken by client sockets (R-IN-5).",
            value=total,
        )
        yield GaugeMetricFamily(
            "iop_relay_buffered_bytes_max", "The largest such buffer of one run.", value=largest
        )
        yield GaugeMetricFamily(
            "iop_relay_held_streams", "Streams waiting for their client to read.", value=held
        )
        gate = CounterMetricFamily(
            "iop_gate_events", "Stream Evidence Gate outcomes per provider (R-SEG-6, R-SEG-8).",
            labels=["provider", "outcome"],
        )  # fmt: skip
        for provider_id, outcome, count in self._runtime.gate.items():
            gate.add_metric([provider_id, outcome], float(count))
        yield gate
        yield GaugeMetricFamily(
            "iop_pool_reachable",
            "1 while the pool's store answers (always 1 in memory; scale-out: Redis).",
            value=1.0 if self._runtime.pool.reachable else 0.0,
        )
        yield GaugeMetricFamily(
            "iop_edge_start_time_seconds", "When this Edge process started (epoch seconds).",
            value=self._runtime.started_at,
        )  # fmt: skip
        tracing = getattr(self._runtime, "tracing", None)
        if tracing is not None:  # R-OBS-2: traces lost to a failing collector, counted
            yield CounterMetricFamily(
                "iop_trace_export_failures",
                "Span batches the collector refused, failed or did not take in time.",
                value=float(tracing.failed_batches),
            )

    def _health_counters(self) -> Iterator[Metric]:
        ejections = CounterMetricFamily(
            "iop_provider_ejections", "Times the provider was ejected (R-HEALTH-2).",
            labels=["provider"],
        )  # fmt: skip
        for provider_id, count in sorted(self._runtime.pool.ejections_total.items()):
            ejections.add_metric([provider_id], float(count))
        yield ejections
        retries = CounterMetricFamily(
            "iop_retries", "Requests sent to another provider after a failure before the first "
            "byte, by model group and the provider that failed (R-HEALTH-1).",
            labels=["model", "provider"],
        )  # fmt: skip
        for (model, provider_id), count in sorted(self._runtime.health.retries.items()):
            retries.add_metric([model, provider_id], float(count))
        yield retries
        hits, misses = self._runtime.pool.affinity_counts  # R-AFF-1
        for name, doc, counts in (
            ("iop_affinity_hits", "Requests the provider that last ran their key took (R-AFF-1).",
             hits),
            ("iop_affinity_misses", "Requests with an affinity key that the pool's own rule "
             "placed: no entry, expired, or that provider had no free slot (R-AFF-1).", misses),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=["model_group"])
            for group, count in sorted(counts.items()):
                family.add_metric([group], float(count))
            yield family


class _Scrape(Collector):
    """Everything one scrape exposes, as a single collector for ``generate_latest``."""

    def __init__(self, collectors: Iterable[Collector]) -> None:
        self._collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self._collectors:
            yield from collector.collect()


def render_metrics(runtime: DataPlane) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of the meter, the pool and the loop."""
    return generate_latest(
        _Scrape((runtime.meter.registry, PoolCollector(runtime), runtime.loop_lag))
    )


async def metrics_response(runtime: DataPlane, send: Any) -> None:
    """Send a complete 200 response with the exposition text (ASGI)."""
    body = render_metrics(runtime)
    await send({
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"content-type", CONTENT_TYPE_PLAIN_0_0_4.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def scrape_allowed(runtime: DataPlane, headers: list[tuple[bytes, bytes]]) -> bool:
    """True only when a scrape token is configured and ``Authorization: Bearer`` matches it."""
    ref = runtime.snapshot.metrics_token
    if ref is None:
        return False
    presented = presented_bearer(headers)
    if presented is None:
        return False
    try:
        expected = ref.resolve().encode()
    except SecretUnavailableError as exc:
        logger.warning("metrics scrape refused: %s", exc)  # names the reference, not a value
        return False
    return hmac.compare_digest(presented, expected)
