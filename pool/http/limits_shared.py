"""Per-token limits across Edges: the counters of ``limits.TokenLimiter`` kept in Redis.

R-SCALE-6 (docs/scale-out.md, "Per-token limits across Edges"). Scale-out only; one Edge keeps
the in-memory ``TokenLimiter``. Every admission is one atomic script on Redis time, so the
limits are exact across Edges: ``max_in_flight`` is a sorted set of slots, each expiring one
TTL after its Edge last renewed it (a dead Edge's slots come back by themselves), and ``rpm`` /
``tpm`` count per fixed window of Redis time. The end of a request is queued and sent by one
writer task (the request never waits for it); ``tpm`` is settled to the real usage there, with
the same rules as the in-memory limiter. No Django here.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import deque
from itertools import count
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from pool.http.limits import IN_FLIGHT_RETRY_S, Quota, RateLimited, Ticket, TokenLimits

log = logging.getLogger("iop.http")

REDIS_ERRORS = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
MAX_BATCH = 256  # settles sent in one pipeline


class LimitsUnavailable(Exception):
    """Redis did not answer the admission: the request gets 503 ``pool_unavailable``."""


class SharedTicket(Ticket):
    """A ticket whose in-flight slot is a member of the token's slot set in Redis."""

    __slots__ = ("slot",)

    def __init__(self, token_ref: str, window: int, estimate: int, quota: Quota | None,
                 slot: str) -> None:  # fmt: skip
        super().__init__(token_ref, window, estimate, quota)
        self.slot = slot


class SharedTokenLimiter:
    """``admit`` (one round trip) and ``finish`` (queued) against counters shared in Redis."""

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str,
        window_s: float = 60.0,
        ttl_s: float = 10.0,
    ) -> None:
        if window_s <= 0 or ttl_s <= 0:
            raise ValueError("window_s and ttl_s must be > 0")
        self._url = redis_url
        self.prefix = prefix
        self.window_ms = max(1, round(window_s * 1000))
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.renew_s = ttl_s / 3
        self._redis: Redis | None = None
        self._scripts: dict[str, Any] = {}
        self._boot = secrets.token_hex(4)  # slot ids unique across Edges and restarts
        self._ids = count(1)
        self._held: dict[str, dict[str, SharedTicket]] = {}  # token ref -> slot -> ticket
        self._settles: deque[list[str]] = deque()
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.time_override: str = ""  # tests: Redis time in ms

    async def start(self) -> None:
        self._redis = Redis.from_url(
            self._url, socket_connect_timeout=1.0, socket_timeout=max(1.0, self.renew_s)
        )
        self._scripts = {name: self._redis.register_script(text) for name, text in _LUA.items()}
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._writer()), loop.create_task(self._renewer())]

    async def aclose(self) -> None:
        """Send the settles still queued (bounded), then disconnect; held slots expire."""
        if self._redis is None:
            return
        if self._settles:
            try:
                await asyncio.wait_for(self._send_settles(), timeout=2.0)
            except (TimeoutError, *REDIS_ERRORS):
                log.warning("stopping with limiter updates not sent; their slots expire by TTL")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._redis.aclose()
        self._redis = None

    def _keys(self, token_ref: str) -> list[str]:
        base = f"{self.prefix}:lim:{token_ref}"
        return [f"{base}:fly", f"{base}:win"]

    async def admit(self, token_ref: str, limits: TokenLimits, estimate: int) -> SharedTicket:
        """Charge one request and its input estimate across every Edge, or raise
        ``RateLimited``; ``LimitsUnavailable`` when Redis does not answer."""
        assert self._redis is not None, "start() first"
        slot = f"{self._boot}.{next(self._ids):x}"
        args = [
            self.window_ms,
            self.ttl_ms,
            slot,
            _arg(limits.max_in_flight),
            _arg(limits.rpm),
            _arg(limits.tpm),
            estimate,
            self.time_override,
        ]
        try:
            out = await self._scripts["admit"](keys=self._keys(token_ref), args=args)
        except REDIS_ERRORS as exc:
            raise LimitsUnavailable(type(exc).__name__) from None
        verdict, requests, tokens, reset_ms, window = out
        verdict = verdict.decode() if isinstance(verdict, bytes) else verdict
        reset_s = int(reset_ms) / 1000
        quota = Quota(
            limit_requests=limits.rpm,
            remaining_requests=max(0, (limits.rpm or 0) - int(requests)),
            limit_tokens=limits.tpm,
            remaining_tokens=max(0, (limits.tpm or 0) - int(tokens)),
            reset_s=reset_s,
        )
        if verdict != "ok":
            retry = IN_FLIGHT_RETRY_S if verdict == "max_in_flight" else reset_s
            raise RateLimited(verdict, retry, quota)
        ticket = SharedTicket(
            token_ref, int(window), estimate, quota if limits.rpm or limits.tpm else None, slot
        )
        self._held.setdefault(token_ref, {})[slot] = ticket
        return ticket

    def finish(self, ticket: Ticket, used_tokens: int | None = None) -> bool:
        """The request ended: its slot is freed and ``tpm`` settled, queued for the writer
        (never awaited by the request). False when already finished."""
        if ticket.done or not isinstance(ticket, SharedTicket):
            return False
        ticket.done = True
        held = self._held.get(ticket.token_ref)
        if held is not None:
            held.pop(ticket.slot, None)
            if not held:
                del self._held[ticket.token_ref]
        correction = "" if used_tokens is None else str(used_tokens - ticket.estimate)
        self._settles.append([ticket.token_ref, ticket.slot, str(ticket.window), correction])
        self._kick.set()
        return True

    def in_flight(self, token_ref: str) -> int:
        """Slots this Edge holds for ``token_ref``."""
        return len(self._held.get(token_ref, ()))

    async def _writer(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self._send_settles()
            except REDIS_ERRORS as exc:  # the slots expire by TTL; tpm keeps its estimate
                log.warning("per-token limits: settles not sent (%s)", type(exc).__name__)

    async def _send_settles(self) -> None:
        assert self._redis is not None
        while self._settles:
            batch = [self._settles.popleft() for _ in range(min(MAX_BATCH, len(self._settles)))]
            pipe = self._redis.pipeline(transaction=False)
            for token_ref, *rest in batch:
                args = [self.window_ms, *rest, self.time_override]
                await self._scripts["settle"](keys=self._keys(token_ref), args=args, client=pipe)
            await pipe.execute()

    async def _renewer(self) -> None:
        """Every TTL/3: push the expiry of every slot this Edge still holds one TTL ahead."""
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                await self.renew()
            except REDIS_ERRORS as exc:
                log.warning("per-token limits: slots not renewed (%s)", type(exc).__name__)

    async def renew(self) -> None:
        if not self._held or self._redis is None:
            return
        keys: list[str] = []
        args: list[Any] = [self.ttl_ms, self.time_override]
        for token_ref, held in self._held.items():
            keys.append(self._keys(token_ref)[0])
            args += [len(held), *held]
        await self._scripts["renew"](keys=keys, args=args)


def _arg(value: int | None) -> str | int:
    return "" if value is None else value


_NOW = """
local function now_ms(override)
  if override ~= '' then return tonumber(override) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS: slots (zset: slot -> expiry ms), window (hash: w, req, tok)
# ARGV: window ms, ttl ms, slot, max_in_flight, rpm, tpm ('' = none), estimate, now override
_ADMIT = (
    _NOW
    + """
local wms, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local maxf, rpm, tpm = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local est = tonumber(ARGV[7])
local now = now_ms(ARGV[8])
local w = math.floor(now / wms)
local reset = (w + 1) * wms - now
local req, tok = 0, 0
local row = redis.call('HMGET', KEYS[2], 'w', 'req', 'tok')
if tonumber(row[1]) == w then
  req, tok = tonumber(row[2]) or 0, tonumber(row[3]) or 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if maxf and redis.call('ZCARD', KEYS[1]) >= maxf then
  return {'max_in_flight', req, tok, reset, w}
end
if rpm and req >= rpm then return {'rpm', req, tok, reset, w} end
-- A request larger than the whole budget still runs alone in a fresh window (limits.py).
if tpm and tok > 0 and tok + est > tpm then return {'tpm', req, tok, reset, w} end
req, tok = req + 1, tok + est
redis.call('HSET', KEYS[2], 'w', w, 'req', req, 'tok', tok)
redis.call('PEXPIRE', KEYS[2], reset + wms)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
return {'ok', req, tok, reset, w}
"""
)

# KEYS: slots, window. ARGV: window ms, slot, admission window, correction ('' = none), now
_SETTLE = (
    _NOW
    + """
redis.call('ZREM', KEYS[1], ARGV[2])
local corr = tonumber(ARGV[4])
if not corr or corr == 0 then return 0 end
local wms = tonumber(ARGV[1])
local now = now_ms(ARGV[5])
local w = math.floor(now / wms)
local cw = tonumber(redis.call('HGET', KEYS[2], 'w'))
if cw == w and tonumber(ARGV[3]) == w then
  local tok = (tonumber(redis.call('HGET', KEYS[2], 'tok')) or 0) + corr
  redis.call('HSET', KEYS[2], 'tok', math.max(0, tok))
elseif corr > 0 then
  if cw ~= w then
    redis.call('HSET', KEYS[2], 'w', w, 'req', 0, 'tok', corr)
    redis.call('PEXPIRE', KEYS[2], (w + 2) * wms - now)
  else
    redis.call('HINCRBY', KEYS[2], 'tok', corr)
  end
end
return 1
"""
)

# KEYS: one slot set per token. ARGV: ttl ms, now override, then per key: n, n slots.
_RENEW = (
    _NOW
    + """
local ttl = tonumber(ARGV[1])
local expiry = now_ms(ARGV[2]) + ttl
local i = 3
for k = 1, #KEYS do
  local n = tonumber(ARGV[i])
  for j = 1, n do redis.call('ZADD', KEYS[k], 'XX', expiry, ARGV[i + j]) end
  i = i + n + 1
  redis.call('PEXPIRE', KEYS[k], ttl)
end
return 1
"""
)

_LUA = {"admit": _ADMIT, "settle": _SETTLE, "renew": _RENEW}
