"""Upstream HTTP with aiohttp: one session per registry, our own first-byte/idle timeouts.

aiohttp rather than httpx: measured faster under concurrency, and leaving a half-read
response closes its connection at once, so a cancelled run is seen upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec

from nodes.agent.adapters.base import AdapterError
from nodes.agent.limits import DEFAULT_LIMITS, Limits
from nodes.agent.policy import Gate, Use
from nodes.agent.secrets import redact, resolve_secret
from nodes.agent.tracing import UpstreamCall, upstream_call
from nodes.agent.watchdog import Watchdog
from nodes.wire import (
    MAX_RETRY_AFTER_S,
    PHASE_AFTER_FIRST_BYTE,
    PHASE_BEFORE_FIRST_BYTE,
    PHASE_CONNECT,
    ProviderPayload,
)

MAX_ERROR_BODY = 64 * 1024
MAX_MESSAGE_CHARS = 300
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
# Set by the HTTP client itself; a forwarded value would corrupt the request.
_UNFORWARDABLE = {"host", "content-length", "transfer-encoding", "connection"}


def auth_headers(provider: ProviderPayload, credential: str | None) -> dict[str, str]:
    """The credential placed as the provider's auth spec says (bearer or a named header)."""
    if credential is None or provider.auth.type == "none":
        return {}
    if provider.auth.type == "bearer":
        return {"Authorization": f"Bearer {credential}"}
    if provider.auth.type == "header":
        scheme = provider.auth.scheme
        return {provider.auth.header: f"{scheme} {credential}" if scheme else credential}
    raise ValueError(f"provider {provider.id}: unknown auth type {provider.auth.type!r}")


def slot_headers(provider: ProviderPayload, secret: str | None) -> dict[str, str]:
    """A managed run's slot secret as the provider's auth header (R-MGD-11): as its profile's
    auth says, and ``Authorization: Bearer`` for a profile that sends none (the built-in
    ``ollama``, an Ollama behind an authenticating proxy)."""
    if secret is None:
        return {}
    if provider.auth.type == "none":
        return {"Authorization": f"Bearer {secret}"}
    return auth_headers(provider, secret)


def provider_headers(provider: ProviderPayload) -> tuple[dict[str, str], tuple[str, ...]]:
    """The headers every upstream request of a provider carries, and the secret in them
    (resolved on this machine; kept to redact it from any message)."""
    credential = None
    if provider.credential is not None and provider.auth.type != "none":
        credential = resolve_secret(provider.credential, what=f"provider {provider.id}")
    headers = merge_headers({"Content-Type": "application/json"}, provider.headers)
    headers = merge_headers(headers, auth_headers(provider, credential))
    return headers, ((credential,) if credential else ())


def merge_headers(base: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """Later headers replace earlier ones of the same name, compared case-insensitively."""
    out = dict(base)
    for name, value in extra.items():
        if name.lower() in _UNFORWARDABLE:
            continue
        for existing in [k for k in out if k.lower() == name.lower()]:
            del out[existing]
        out[name] = value
    return out


class HttpClient:
    """Owns the registry's ClientSession, created on first use inside the running loop.

    R-TLS-4: no cookie jar (nothing one caller's upstream sets reaches another request),
    no redirects (``Upstream`` refuses a 3xx), and ``limits`` on what is buffered.
    R-TLS-3: ``gate`` checks every URL before it is dialed."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, gate: Gate | None = None) -> None:
        self.limits = limits
        self.gate = gate or Gate()
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                # limit=0: the pool's capacity bounds concurrency, not aiohttp's default 100.
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
                # total=None: streams may last longer than 5 minutes; we time gaps ourselves.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None),
                read_bufsize=256 * 1024,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _where(url: str) -> str:
    """host:port of a URL: safe to show (no path, query or user-info)."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def _to(resp: aiohttp.ClientResponse) -> str:
    location = resp.headers.get("Location", "")
    if not location:
        return ""
    target = urlsplit(location)
    return f" to {_where(location)}" if target.hostname else " on the same host"


def retry_after_s(value: str | None) -> float | None:
    """An upstream's ``Retry-After`` in seconds (delta-seconds or an HTTP date), bounded;
    None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()[:64]
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, min(seconds, MAX_RETRY_AFTER_S))


def error_message(status: int, body: bytes, secrets: tuple[str, ...] = ()) -> str:
    """A short text from an upstream error body (its error.message when it has one), for the
    Node's log only: the caller gets ``upstream returned HTTP <status>``."""
    detail = ""
    try:
        data: Any = msgspec.json.decode(body)
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            detail = err["message"]
        elif isinstance(err, str):
            detail = err
        elif isinstance(data.get("message"), str):
            detail = data["message"]
        elif isinstance(data.get("detail"), str):
            detail = data["detail"]
    detail = redact(detail.strip(), secrets)[:MAX_MESSAGE_CHARS]
    return f"upstream returned HTTP {status}" + (f": {detail}" if detail else "")


class Upstream:
    """One upstream exchange. The first body chunk must arrive within ``first_byte_s`` of
    sending; each later gap within ``idle_s``. Leaving early drops the connection."""

    def __init__(
        self,
        http: HttpClient,
        method: str,
        url: str,
        *,
        provider: ProviderPayload,
        headers: Mapping[str, str],
        body: bytes | None,
        first_byte_s: float,
        idle_s: float,
        secrets: tuple[str, ...] = (),
    ) -> None:
        self._http, self._method, self._url = http, method, url
        self._provider = provider
        self._headers, self._body, self._secrets = dict(headers), body, secrets
        self._first_byte_s, self._idle_s = first_byte_s, idle_s
        self._deadline = 0.0
        self._dog: Watchdog | None = None  # the first-byte and idle deadlines of its reads
        self._call: UpstreamCall | None = None  # R-OBS-1, R-OBS-2: a run's call is observed
        self._resp: aiohttp.ClientResponse | None = None
        self._eof = False
        self.started = False  # True once any body byte arrived

    async def __aenter__(self) -> Upstream:
        refusal = self._http.gate.check(self._provider, Use.dial(self._url))
        if refusal is not None:  # R-TLS-3: no URL is dialed without the policy's check
            raise AdapterError(
                "upstream_error",
                "the node's policy refuses this upstream",
                detail=f"refused by node policy: {refusal}",
                retryable=True,
                phase=PHASE_CONNECT,
            )
        self._call = call = upstream_call(self._method, self._url)
        try:
            return await self._open(call)
        except BaseException as exc:
            if self._dog is not None:
                self._dog.close()
            if call is not None:
                call.done(self.status, getattr(exc, "code", type(exc).__name__))
            raise

    async def _open(self, call: UpstreamCall | None) -> Upstream:
        self._dog = dog = Watchdog()
        self._deadline = asyncio.get_running_loop().time() + self._first_byte_s
        headers = self._headers if call is None else {**self._headers, **call.headers}
        dog.until(self._deadline)
        try:
            self._resp = await self._http.session().request(
                self._method,
                self._url,
                headers=headers,
                data=self._body,
                allow_redirects=False,  # R-TLS-4: a 3xx is an upstream_error
            )
        except asyncio.CancelledError:
            if dog.took():
                raise self._timeout() from None
            raise
        except aiohttp.ClientError as exc:
            raise self._client_error(exc) from None
        finally:
            dog.clear()
        if 300 <= self._resp.status < 400:
            self._resp.close()
            raise AdapterError(
                "upstream_error",
                f"the upstream answered HTTP {self._resp.status}, a redirect: not followed",
                detail=f"upstream {_where(self._url)} answered HTTP {self._resp.status} "
                f"(a redirect{_to(self._resp)}); redirects are not followed",
                status=self._resp.status,
            )
        if self._resp.status >= 400:
            try:
                await self._fail_with_status(self._resp)
            finally:
                self._resp.close()  # __aexit__ does not run when __aenter__ raises
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._dog is not None:
            self._dog.close()
        if self._call is not None:
            code = None if exc is None else getattr(exc, "code", type(exc).__name__)
            self._call.done(self.status, code)
        if self._resp is None:
            return
        if self._eof:
            self._resp.release()
        else:
            self._resp.close()  # half-read (cancel, timeout, error): drop the connection

    @property
    def status(self) -> int:
        return self._resp.status if self._resp is not None else 0

    async def read(self) -> bytes:
        """The next body chunk as it arrives; b"" at the end."""
        assert self._resp is not None and self._dog is not None
        dog = self._dog
        if self.started:
            dog.within(self._idle_s)
        else:
            dog.until(self._deadline)
        try:
            chunk = await self._resp.content.readany()
        except asyncio.CancelledError:
            if dog.took():
                raise self._timeout() from None
            raise
        except aiohttp.ClientError as exc:
            raise self._client_error(exc) from None
        finally:
            dog.clear()
        if chunk:
            self.started = True
        else:
            self._eof = True
        return chunk

    async def read_all(self) -> bytes:
        """The whole body, refused as soon as it passes ``limits.max_body_bytes``."""
        cap = self._http.limits.max_body_bytes
        parts, size = [], 0
        while chunk := await self.read():
            size += len(chunk)
            if size > cap:
                raise AdapterError(
                    "upstream_error",
                    f"the upstream answer is over {cap} bytes (limits.max_body_bytes)",
                    detail=f"upstream {_where(self._url)} sent a body over {cap} bytes",
                    status=self.status or None,
                )
            parts.append(chunk)
            if self._resp is not None and self._resp.content.at_eof():
                self._eof = True  # the whole body is in: no read waits for its end
                break
        return b"".join(parts)

    async def _fail_with_status(self, resp: aiohttp.ClientResponse) -> None:
        body = b""
        try:
            async with asyncio.timeout(min(self._idle_s, 10.0)):
                while len(body) < MAX_ERROR_BODY:
                    chunk = await resp.content.readany()
                    if not chunk:
                        break
                    body += chunk
        except (TimeoutError, aiohttp.ClientError):
            pass  # the status alone is enough to report
        raise AdapterError(
            "upstream_error",
            f"upstream returned HTTP {resp.status}",
            detail=f"{_where(self._url)} "
            + error_message(resp.status, body[:MAX_ERROR_BODY], self._secrets),
            retryable=resp.status in _RETRYABLE_STATUS,
            status=resp.status,
            phase=PHASE_BEFORE_FIRST_BYTE,
            retry_after_s=retry_after_s(resp.headers.get("Retry-After"))
            if resp.status == 429
            else None,
        )

    def _timeout(self) -> AdapterError:
        if self.started:
            message = f"upstream sent nothing for {self._idle_s:g}s (idle timeout)"
        else:
            message = f"no response from upstream within {self._first_byte_s:g}s (first byte)"
        return AdapterError(
            "upstream_timeout", message, retryable=not self.started, phase=self._phase()
        )

    def _phase(self) -> str:
        return PHASE_AFTER_FIRST_BYTE if self.started else PHASE_BEFORE_FIRST_BYTE

    def _client_error(self, exc: aiohttp.ClientError) -> AdapterError:
        detail = f"upstream {_where(self._url)}: {type(exc).__name__}"
        if isinstance(exc, aiohttp.ServerTimeoutError):
            return AdapterError(
                "upstream_timeout",
                "connecting to the upstream timed out",
                detail=detail,
                retryable=True,
                phase=PHASE_CONNECT,
            )
        if isinstance(exc, aiohttp.ClientConnectorError):  # refused, DNS, TLS
            return AdapterError(
                "upstream_error",
                "cannot connect to the upstream",
                detail=detail,
                retryable=True,
                phase=PHASE_CONNECT,
            )
        if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
            text = "the upstream closed the connection mid-response"
        else:
            text = "the upstream request failed"
        return AdapterError(
            "upstream_error",
            text,
            detail=detail,
            retryable=not self.started,
            status=self.status or None,
            phase=self._phase(),
        )
