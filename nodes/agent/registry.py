"""The adapter registry built from one node payload, and the swap that retires it (R-NODE-5)."""

from __future__ import annotations

import asyncio
import logging

from nodes.agent.adapters.base import Adapter, AdapterError
from nodes.agent.adapters.cli import CliAdapter
from nodes.agent.adapters.http import HttpClient
from nodes.agent.adapters.ollama import OllamaAdapter
from nodes.agent.adapters.openai_compat import OpenAICompatAdapter
from nodes.agent.limits import DEFAULT_LIMITS, Limits
from nodes.agent.policy import Gate, NodePolicy
from nodes.agent.secrets import SecretError
from nodes.wire import NodePayload, ProviderPayload
from obskit.logs import printable

log = logging.getLogger("iop_node.registry")


def _build_adapter(
    provider: ProviderPayload, http: HttpClient, limits: Limits, gate: Gate
) -> Adapter:
    if provider.adapter == "openai_compat":
        return OpenAICompatAdapter(provider, http)
    if provider.adapter == "ollama":
        return OllamaAdapter(provider, http)
    if provider.adapter == "cli":
        return CliAdapter(provider, limits, gate)
    raise ValueError(f"provider {provider.id}: unknown adapter {provider.adapter!r}")


class Registry:
    """Adapters by provider id for one payload revision, with a count of active runs."""

    def __init__(
        self,
        payload: NodePayload,
        policy: NodePolicy | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.revision = payload.revision
        self.payload = payload
        self.gate = Gate(policy)  # R-TLS-3: the one check, also at every start and dial
        self.http = HttpClient(limits, self.gate)
        self.adapters: dict[str, Adapter] = {}
        self.providers = {provider.id: provider for provider in payload.providers}
        self.errors: dict[str, str] = {}  # provider id -> why it cannot run here
        for provider in payload.providers:
            shown = printable(provider.id, 100)  # the Edge's text, in this Node's log (R-TLS-9)
            refusal = self.gate.provider(provider)
            if refusal is not None:  # R-TLS-3: never built, so it never runs nor is probed
                self.errors[provider.id] = f"refused by node policy: {refusal}"
                log.error("provider %s refused by node policy: %s", shown, printable(refusal))
                continue
            try:
                self.adapters[provider.id] = _build_adapter(provider, self.http, limits, self.gate)
            except (SecretError, ValueError) as exc:
                self.errors[provider.id] = str(exc)  # names references, never values
                log.error("provider %s is unusable on this node: %s", shown, printable(str(exc)))
        self.active = 0
        self._closed = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def get(self, provider_id: str) -> Adapter:
        adapter = self.adapters.get(provider_id)
        if adapter is not None:
            return adapter
        if provider_id in self.errors:
            raise AdapterError(
                "upstream_error",
                "the provider is unusable on this node",
                detail=f"provider {provider_id}: {self.errors[provider_id]}",
            )
        raise AdapterError(
            "unknown_provider",
            "the provider is not on this node",
            detail=f"provider {provider_id} is not on this node",
        )

    def begin_run(self) -> None:
        """Count one more active run (call end_run exactly once for it)."""
        self.active += 1
        self._idle.clear()

    def end_run(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._idle.set()

    async def drain_and_close(self) -> None:
        """Wait until no run is active, then close every adapter and the HTTP session."""
        await self._idle.wait()
        await self.aclose()

    async def aclose(self) -> None:
        if self.closed:
            return
        self._closed.set()
        for provider_id, adapter in self.adapters.items():
            try:
                await adapter.aclose()
            except Exception:
                log.exception("closing adapter %s failed", provider_id)
        await self.http.aclose()


class Registries:
    """The current registry, plus retired ones closing once their runs drain (R-NODE-5)."""

    def __init__(self, policy: NodePolicy | None = None, limits: Limits = DEFAULT_LIMITS) -> None:
        self.policy, self.limits = policy, limits
        self.current: Registry | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    def install(self, payload: NodePayload) -> Registry:
        """Build a registry for ``payload`` and make it current; new runs use it at once.
        The same revision (e.g. on reconnect) keeps a healthy current registry as it is."""
        cur = self.current
        reusable = cur is not None and not cur.closed and not cur.errors
        if cur is not None and reusable and cur.revision == payload.revision:
            return cur
        new = Registry(payload, self.policy, self.limits)
        old, self.current = self.current, new
        if old is not None:
            task = asyncio.create_task(old.drain_and_close(), name=f"retire-{old.revision}")
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        return new

    async def aclose(self) -> None:
        """Close the current registry and wait for retired ones (call after runs ended)."""
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        if self.current is not None:
            await self.current.drain_and_close()
