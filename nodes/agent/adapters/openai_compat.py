"""Passthrough to OpenAI-compatible upstreams (drivers openai_chat, anthropic_messages,
openai_responses): the body goes upstream as is, the response comes back as is."""

from __future__ import annotations

import codecs

import msgspec

from nodes.agent.adapters.base import AdapterError, Emit, RunSpec, send, usage_from
from nodes.agent.adapters.http import (
    HttpClient,
    Upstream,
    merge_headers,
    provider_headers,
    slot_headers,
)
from nodes.agent.adapters.sse import UsageScanner
from nodes.wire import ANTHROPIC_VERSION, ProviderPayload, Usage

_GET_OPERATIONS = {"models"}
_METERED_OPERATIONS = {"chat_completions", "messages", "responses"}


class OpenAICompatAdapter:
    """POST (GET for ``models``) to ``provider.operations[operation]`` and relay the answer."""

    def __init__(self, provider: ProviderPayload, http: HttpClient) -> None:
        self.provider = provider
        self._http = http
        self._headers, self._secrets = provider_headers(provider)
        if provider.driver == "anthropic_messages":
            # R-XLATE-3: the Messages API refuses a request without its version header.
            self._headers = merge_headers({"anthropic-version": ANTHROPIC_VERSION}, self._headers)

    async def run(self, request: RunSpec, emit: Emit) -> Usage | None:
        url = self.provider.operations.get(request.operation)
        if not url:
            raise AdapterError(
                "bad_request",
                "the provider does not serve this operation",
                detail=f"provider {self.provider.id} does not serve operation {request.operation}",
            )
        method = "GET" if request.operation in _GET_OPERATIONS else "POST"
        # The Edge already sent the served target, mapped once (R-PROF-5): never remapped here.
        body = None if method == "GET" else request.body
        # R-AUTH-2: a forwarded caller credential replaces the configured one.
        headers = merge_headers(self._headers, request.forward_headers)
        # R-MGD-4: a managed run's slot secret, placed by the provider's auth.
        headers = merge_headers(headers, slot_headers(self.provider, request.credential))
        forwarded = tuple(request.forward_headers.values())
        # An upstream may echo the bare key of a forwarded "Bearer <key>": redact both forms.
        bare = tuple(value.split(" ", 1)[1] for value in forwarded if " " in value)
        slot = (request.credential,) if request.credential else ()
        secrets = self._secrets + forwarded + bare + slot
        async with Upstream(
            self._http,
            method,
            url,
            provider=self.provider,
            headers=headers,
            body=body,
            first_byte_s=self.provider.first_byte_timeout_s,
            idle_s=self.provider.idle_timeout_s,
            secrets=secrets,
        ) as upstream:
            if request.stream:
                return await self._relay_stream(upstream, emit)
            raw = await upstream.read_all()
        await send(emit, raw.decode("utf-8", errors="replace"))
        if request.operation not in _METERED_OPERATIONS:
            return None
        try:
            data = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            return None
        return usage_from(data.get("usage")) if isinstance(data, dict) else None

    async def _relay_stream(self, upstream: Upstream, emit: Emit) -> Usage | None:
        # Relay each chunk as it arrives; usage is read on the side, never delaying it.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        scanner = UsageScanner()
        while chunk := await upstream.read():
            text = decoder.decode(chunk)
            if text:
                scanner.feed(text)
                await send(emit, text)
        tail = decoder.decode(b"", final=True)
        if tail:
            scanner.feed(tail)
            await send(emit, tail)
        scanner.feed("\n")
        return scanner.usage

    async def aclose(self) -> None:
        """The shared HTTP session belongs to the registry; nothing of our own to close."""
