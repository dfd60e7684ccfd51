"""Per-token limits across Edges: the counters of ``limits.TokenLimiter`` kept in Redis.

R-SCALE-6 (docs/scale-out.md, "Per-token limits across Edges"). Scale-out only; one Edge keeps
the in-memory ``TokenLimiter``. Every admission is one atomic script on Redis time, so the
limits are exact across Edges: ``max_in_flight`` is a sorted set of slots, each expiring one
TTL after its Edge last renewed it (a dead Edge's slots come back by themselves), and ``rpm`` /
``tpm`` count per fixed window of Redis time. The end of a request is queued (the request
never waits for it); ``tpm`` is settled to the real usage then, with the same rules as the
in-memory limiter. No Django here.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections import deque
from itertools import count
from typing import Any

from redis import exceptions as redis_errors
from redis.asyncio import Redis

from pool.engine_redis import connect
from pool.http.limits import (
    IN_FLIGHT_RETRY_S,
    LimitsUnavailable,
    Quota,
    RateLimited,
    Ticket,
    TokenLimits,
)
from pool.http.limits_scripts import SCRIPTS

log = logging.getLogger("iop.http")

REDIS_ERRORS = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)
MAX_BATCH = 256  # jobs sent in one pipeline
SETTLE_DELAY_S = 0.05  # an ended request's settle waits at most this for an admission to join


class SharedTicket(Ticket):
    """A ticket whose in-flight slot is a member of the token's slot set in Redis."""

    __slots__ = ("slot",)

    def __init__(self, token_ref: str, window: int, estimate: int, quota: Quota | None,
                 slot: str) -> None:  # fmt: skip
        super().__init__(token_ref, window, estimate, quota)
        self.slot = slot


class _Job:
    __slots__ = ("args", "future", "keys", "script")

    def __init__(self, script: str, keys: list[str], args: list[Any],
                 future: asyncio.Future[Any] | None = None) -> None:  # fmt: skip
        self.script, self.keys, self.args, self.future = script, keys, args, future


class SharedTokenLimiter:
    """``admit`` (one round trip) and ``finish`` (queued) against counters shared in Redis.

    An admission alone is one EVALSHA; admissions that come while one is on its way, the
    settles of ended requests (sent with the next batch or within ``SETTLE_DELAY_S``) and
    the renewals go in order through one writer task, one pipeline per batch. Measured in
    docs/scale-out.md, "Per-token limits across Edges"."""

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
        self._sha: dict[str, str] = {}
        self._boot = secrets.token_hex(4)  # slot ids unique across Edges and restarts
        self._ids = count(1)
        self._held: dict[str, dict[str, SharedTicket]] = {}  # token ref -> slot -> ticket
        self._jobs: deque[_Job] = deque()
        self._kick = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._admitting = False  # one admission is on its way by itself
        self._sending = False  # the writer has a batch on its way: later jobs go behind it
        self._tasks: list[asyncio.Task[None]] = []
        self.time_override: str = ""  # tests: Redis time in ms

    async def start(self) -> None:
        self._redis = connect.parse(self._url).client(
            socket_connect_timeout=1.0, socket_timeout=max(1.0, self.renew_s)
        )
        self._sha = {name: sha1_hex(text) for name, text in SCRIPTS.items()}
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._writer()), loop.create_task(self._renewer())]

    async def aclose(self) -> None:
        """Send the settles still queued (bounded), then disconnect; held slots expire."""
        if self._redis is None:
            return
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._jobs:
            try:
                await asyncio.wait_for(self.flush(), timeout=2.0)
            except (TimeoutError, *REDIS_ERRORS):
                log.warning("stopping with limiter updates not sent; their slots expire by TTL")
        if self._timer is not None:
            self._timer.cancel()
        await self._redis.aclose()
        self._redis = None

    def _keys(self, token_ref: str) -> list[str]:
        base = f"{self.prefix}:lim:{token_ref}"
        return [f"{base}:fly", f"{base}:win"]

    def arrive(self, token_ref: str) -> SharedTicket:
        """R-LIM-1: the request's headers are authenticated: its in-flight slot is taken in
        Redis now (queued, never awaited; renewed like any held slot), so every Edge counts
        it while its body arrives. Admits nothing: ``admit`` with this ticket does."""
        slot = f"{self._boot}.{next(self._ids):x}"
        ticket = SharedTicket(token_ref, -1, 0, None, slot)
        ticket.admitted = False
        self._held.setdefault(token_ref, {})[slot] = ticket
        args = [self.ttl_ms, self.time_override, 1, slot]
        self._jobs.append(_Job("renew", self._keys(token_ref)[:1], args))
        self._kick.set()
        return ticket

    async def admit(
        self,
        token_ref: str,
        limits: TokenLimits,
        estimate: int,
        arrived: SharedTicket | None = None,
    ) -> SharedTicket:
        """Charge one request and its input estimate across every Edge, or raise
        ``RateLimited`` (``arrived``: its slot, taken by ``arrive``, stays held until
        ``finish``); ``LimitsUnavailable`` when Redis does not answer."""
        assert self._redis is not None, "start() first"
        slot = arrived.slot if arrived is not None else f"{self._boot}.{next(self._ids):x}"
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
        keys = self._keys(token_ref)
        # Others on the way, or ended requests' settles or an arrival's slot queued or being
        # sent (a caller's next request right after its last one ended; this request's own
        # slot): join the writer's next pipeline, behind them, never overtake them.
        if self._admitting or self._sending or self._jobs:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._jobs.append(_Job("admit", keys, args, future))
            self._kick.set()
            try:
                out = await future
            except asyncio.CancelledError:  # the charge is given back, here or in _send
                if future.done() and not future.cancelled():
                    self._give_back(keys, args, future)
                raise
        else:  # alone: one EVALSHA, no hop through the writer task
            out = await self._admit_now(keys, args)
        verdict, requests, tokens, reset_ms, window = out
        verdict = _text(verdict)
        reset_s = int(reset_ms) / 1000
        quota = Quota(
            limit_requests=limits.rpm,
            remaining_requests=max(0, (limits.rpm or 0) - int(requests)),
            limit_tokens=limits.tpm,
            remaining_tokens=max(0, (limits.tpm or 0) - int(tokens)),
            reset_s=reset_s,
        )
        if verdict != "ok":
            if arrived is not None:  # the script dropped its slot: never renewed again
                self._drop_held(arrived)
            retry = IN_FLIGHT_RETRY_S if verdict == "max_in_flight" else reset_s
            raise RateLimited(verdict, retry, quota)
        if arrived is not None:
            arrived.window, arrived.estimate, arrived.admitted = int(window), estimate, True
            arrived.quota = quota if limits.rpm or limits.tpm else None
            return arrived
        ticket = SharedTicket(
            token_ref, int(window), estimate, quota if limits.rpm or limits.tpm else None, slot
        )
        self._held.setdefault(token_ref, {})[slot] = ticket
        return ticket

    async def _admit_now(self, keys: list[str], args: list[Any]) -> Any:
        self._admitting = True
        call = asyncio.ensure_future(self._evalsha("admit", keys, args))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:  # the request left: an admitted charge is given back
            call.add_done_callback(lambda done: self._give_back(keys, args, done))
            raise
        finally:
            self._admitting = False

    async def _evalsha(self, script: str, keys: list[str], args: list[Any]) -> Any:
        assert self._redis is not None
        try:
            try:
                return await self._redis.evalsha(self._sha[script], len(keys), *keys, *args)
            except redis_errors.NoScriptError:
                await self._load()
                return await self._redis.evalsha(self._sha[script], len(keys), *keys, *args)
        except REDIS_ERRORS as exc:
            raise LimitsUnavailable(type(exc).__name__) from None

    def _give_back(self, keys: list[str], args: list[Any], done: asyncio.Future[Any]) -> None:
        """Settle back an admission whose request is gone (``args`` as ``admit`` sent them)."""
        if done.cancelled() or done.exception() is not None:
            return
        reply = done.result()
        if _text(reply[0]) == "ok":
            self._queue_settle(keys, args[2], int(reply[4]), str(-args[6]))

    def finish(self, ticket: Ticket, used_tokens: int | None = None) -> bool:
        """The request ended: its slot is freed and ``tpm`` settled, queued for the writer
        (never awaited by the request). False when already finished."""
        if ticket.done or not isinstance(ticket, SharedTicket):
            return False
        ticket.done = True
        self._drop_held(ticket)
        correction = ""  # a request never admitted was charged nothing: its slot only
        if used_tokens is not None and ticket.admitted:
            correction = str(used_tokens - ticket.estimate)
        self._settle(ticket.token_ref, ticket.slot, ticket.window, correction)
        return True

    def _drop_held(self, ticket: SharedTicket) -> None:
        held = self._held.get(ticket.token_ref)
        if held is not None:
            held.pop(ticket.slot, None)
            if not held:
                del self._held[ticket.token_ref]

    def _settle(self, token_ref: str, slot: str, window: int, correction: str) -> None:
        self._queue_settle(self._keys(token_ref), slot, window, correction)

    def _queue_settle(self, keys: list[str], slot: str, window: int, correction: str) -> None:
        args = [self.window_ms, slot, window, correction, self.time_override]
        self._jobs.append(_Job("settle", keys, args))
        if self._timer is None:  # with the next admission, or on its own soon
            self._timer = asyncio.get_running_loop().call_later(SETTLE_DELAY_S, self._kick.set)

    def in_flight(self, token_ref: str) -> int:
        """Slots this Edge holds for ``token_ref``."""
        return len(self._held.get(token_ref, ()))

    async def flush(self) -> None:
        """Send everything queued now (tests, shutdown)."""
        while self._jobs:
            await self._send([self._jobs.popleft() for _ in range(min(MAX_BATCH, len(self._jobs)))])

    async def _writer(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._sending = True
            try:
                while self._jobs:
                    await self._send_batch()
            finally:
                self._sending = False

    async def _send_batch(self) -> None:
        batch = [self._jobs.popleft() for _ in range(min(MAX_BATCH, len(self._jobs)))]
        try:
            await self._send(batch)
        except REDIS_ERRORS as exc:  # slots expire by TTL; tpm keeps its estimate
            log.warning("per-token limits: Redis did not answer (%s)", type(exc).__name__)
            for job in batch:
                if job.future is not None and not job.future.done():
                    job.future.set_exception(LimitsUnavailable(type(exc).__name__))

    async def _send(self, batch: list[_Job]) -> None:
        """One pipeline of EVALSHA (no SCRIPT EXISTS round trip); the scripts are loaded and
        the refused jobs sent again when Redis answers NOSCRIPT (it restarted)."""
        assert self._redis is not None
        replies = await self._pipeline(batch)
        missing = [i for i, r in enumerate(replies) if isinstance(r, redis_errors.NoScriptError)]
        if missing:
            await self._load()
            again = await self._pipeline([batch[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        for job, reply in zip(batch, replies, strict=True):
            if job.future is None:
                continue
            if job.future.cancelled():  # the request left while it was being admitted
                if not isinstance(reply, Exception) and _text(reply[0]) == "ok":
                    self._queue_settle(job.keys, job.args[2], int(reply[4]), str(-job.args[6]))
                continue
            if job.future.done():
                continue
            if isinstance(reply, Exception):
                job.future.set_exception(LimitsUnavailable(type(reply).__name__))
            else:
                job.future.set_result(reply)

    async def _load(self) -> None:
        assert self._redis is not None
        for text in SCRIPTS.values():
            await self._redis.script_load(text)

    async def _pipeline(self, batch: list[_Job]) -> list[Any]:
        assert self._redis is not None
        pipe = self._redis.pipeline(transaction=False)
        for job in batch:
            pipe.evalsha(self._sha[job.script], len(job.keys), *job.keys, *job.args)
        return list(await pipe.execute(raise_on_error=False))

    async def _renewer(self) -> None:
        """Every TTL/3: push the expiry of every slot this Edge still holds one TTL ahead."""
        while True:
            await asyncio.sleep(self.renew_s)
            try:
                await self.renew()
            except (LimitsUnavailable, *REDIS_ERRORS) as exc:
                log.warning("per-token limits: slots not renewed (%s)", type(exc).__name__)

    async def renew(self) -> None:
        if not self._held or self._redis is None:
            return
        keys: list[str] = []
        args: list[Any] = [self.ttl_ms, self.time_override]
        for token_ref, held in self._held.items():
            keys.append(self._keys(token_ref)[0])
            args += [len(held), *held]
        # Through the writer, in order with the settles: a slot freed meanwhile is not re-added.
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._jobs.append(_Job("renew", keys, args, future))
        self._kick.set()
        await future


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def sha1_hex(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def _arg(value: int | None) -> str | int:
    return "" if value is None else value
