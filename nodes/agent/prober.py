"""Active probes (R-HEALTH-3): each provider with ``probe_interval_s`` is checked on this Node
and the verdict goes to the Edge as ``probe_result``.

An HTTP provider is probed with its profile's ``models`` operation (GET, the provider's own
headers and credential); a probe that carries no credential (every managed provider: the
slot secret comes only with a run, R-MGD-10) takes a 401 or 403 as "reachable". A cli
provider is probed with its ``probe_command`` (exit status 0 = healthy), through the same
policy check as its runs (R-TLS-3). A probe is not a run: it takes no capacity slot on the
Edge and is not counted by the registry. Each probe is bounded by the provider's
``first_byte_timeout_s``; a hanging one fails and its connection or process is dropped.
Reasons never carry an upstream address.
"""

from __future__ import annotations

import asyncio
import logging

from nodes import wire
from nodes.agent.adapters.base import AdapterError
from nodes.agent.adapters.cli import CliAdapter
from nodes.agent.adapters.http import Upstream, provider_headers
from nodes.agent.outbox import SendMessage
from nodes.agent.registry import Registry
from nodes.agent.secrets import SecretError

log = logging.getLogger("iop_node.prober")

MAX_PROBE_BODY = 1024 * 1024  # a models list is read up to this much, then dropped


class Prober:
    """One task per probed provider of the current registry; ``follow`` swaps them."""

    def __init__(self, send: SendMessage) -> None:
        self._send = send
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def follow(self, registry: Registry) -> None:
        """Probe the providers of ``registry`` from now on (a refresh installs a new one)."""
        self.stop()
        for provider in registry.payload.providers:
            if provider.probe_interval_s <= 0 or provider.id not in registry.adapters:
                continue
            if provider.adapter == "cli" and not provider.probe_command:
                log.warning("provider %s: probe_interval_s without probe_command", provider.id)
                continue
            if provider.adapter != "cli" and not provider.operations.get("models"):
                log.warning("provider %s: its profile has no models operation", provider.id)
                continue
            task = asyncio.create_task(self._loop(registry, provider), name=f"probe-{provider.id}")
            self._tasks[provider.id] = task

    def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        self.stop()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _loop(self, registry: Registry, provider: wire.ProviderPayload) -> None:
        while True:
            await asyncio.sleep(provider.probe_interval_s)
            ok, reason = await probe_once(registry, provider)
            try:
                await self._send(wire.ProbeResult(provider_id=provider.id, ok=ok, reason=reason))
            except Exception as exc:  # the connection is gone; the client loop reconnects
                log.debug("probe result not sent (%s)", type(exc).__name__)


async def probe_once(registry: Registry, provider: wire.ProviderPayload) -> tuple[bool, str]:
    """(healthy, reason) of one probe, within the provider's first-byte timeout."""
    timeout_s = provider.first_byte_timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            adapter = registry.adapters[provider.id]
            if isinstance(adapter, CliAdapter):
                return await adapter.probe()  # the policy checks its exact argv (R-TLS-3)
            return await _probe_models(registry, provider)
    except TimeoutError:
        return False, f"no answer within {timeout_s:g} s"


async def _probe_models(registry: Registry, provider: wire.ProviderPayload) -> tuple[bool, str]:
    try:
        headers, secrets = provider_headers(provider)
    except SecretError:
        return False, "the provider's credential is not available on the node"
    url = provider.operations["models"]
    try:
        async with Upstream(
            registry.http,
            "GET",
            url,
            provider=provider,
            headers=headers,
            body=None,
            first_byte_s=provider.first_byte_timeout_s,
            idle_s=provider.idle_timeout_s,
            secrets=secrets,
        ) as upstream:
            size = 0
            while chunk := await upstream.read():
                size += len(chunk)
                if size > MAX_PROBE_BODY:
                    break  # it answered; the rest of a huge list is not needed
    except AdapterError as exc:
        if not secrets and exc.status in (401, 403):
            return True, ""  # R-MGD-10: it answered; a probe without a credential expects this
        return False, exc.to_wire().reason
    return True, ""
