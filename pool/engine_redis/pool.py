"""``RedisPool``: the provider pool shared by several Edges through Redis (R-SCALE-2/3).

Every decision is one atomic Lua script (``lua/``) on Redis time; this object keeps only what
this Edge holds (its leases, its waiters' futures, its Nodes' readiness) and hands every call
to ONE ordered writer task, so one Edge's node_ready/node_gone/release reach Redis in call
order. See docs/pool.md, "Redis engine".
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from pool.engine.errors import PoolBackendUnavailable
from pool.engine.estimate import ServiceTimes
from pool.engine.model import Lease, PoolPolicy, PoolSnapshot
from pool.engine.readiness import Readiness

if TYPE_CHECKING:
    from pool.engine.interface import PoolEngine

from . import answers, background, connect, wire
from .answers import Waiting
from .background import CONNECTION_ERRORS
from .jobs import Job
from .link import Link
from .pool_errors import EdgeFenced, EdgeIdInUse

log = logging.getLogger("iop.pool.redis")

STOP_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *CONNECTION_ERRORS)
EDGE_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # docs/pool.md, "Redis engine"
VIEW_MAX_AGE_S = 0.25  # fresh_snapshot() answers figures at most this old (R-SCALE-8)
VIEW_READ_TIMEOUT_S = 1.0  # an older view is read first, within this, else 503


def affinity_args(affinity: tuple[str, float] | None) -> list[str]:
    """The admit script's affinity arguments: the key and how long it holds, in ms."""
    if affinity is None:
        return ["", "0"]
    return [affinity[0], str(max(1, round(affinity[1] * 1000)))]


class RedisPool:
    """Provider pool of one Edge among several; every method runs on the event loop."""

    def __init__(
        self,
        policy: PoolPolicy,
        *,
        redis_url: str,
        prefix: str,
        edge_id: str,
        lease_ttl_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        if lease_ttl_s <= 0:
            raise ValueError("lease_ttl_s must be > 0")
        if not EDGE_ID.fullmatch(edge_id):
            raise ValueError("the Edge id must match [A-Za-z0-9_.-]{1,64}")
        if not prefix or any(c.isspace() for c in prefix):
            raise ValueError("the Redis key prefix must be non-empty, without spaces")
        self._policy = policy
        self._url = redis_url
        self._prefix = prefix
        self._edge = edge_id
        self._ttl_s = lease_ttl_s
        self._clock = clock
        self._background = background  # False: the caller drives renew/sweep/expire (tests)
        self.fence: str | None = None  # this process's fence, from start (R-SCALE-4)
        self.fenced = False
        self.on_fenced: Callable[[], None] | None = None  # called once when fenced
        self._redis: Redis | None = None
        self._link: Link | None = None  # the writer's connection
        self._jobs: deque[Job] = deque()
        self._kick: asyncio.Event | None = None
        self._down = False
        self._epoch: str | None = None
        self._held: dict[int, tuple[Lease, str]] = {}  # lease id -> (lease, epoch granted in)
        self._waiters: dict[str, Waiting] = {}
        self._recent: OrderedDict[str, None] = OrderedDict()  # settled or cancelled waiters
        self._early: dict[str, list[Any]] = {}  # fates that came before their admit answer
        self._nodes = Readiness()  # Nodes ready on this Edge (R-NODE-1), re-asserted by renew
        self._view = wire.offline(policy)
        self._view_at = -VIEW_MAX_AGE_S  # when the view's read was sent, this Edge's clock
        self._reading: asyncio.Future[PoolSnapshot] | None = None
        self._owners: dict[str, int] = {}
        self._ejected_until: dict[str, float] = {}  # provider -> end of ejection, our clock
        self._ejections: dict[str, int] = {}
        self._pending: set[str] = set()  # periodic jobs queued and not yet run
        self._expiry: asyncio.TimerHandle | None = None
        self.on_health_change: Callable[[], None] | None = None
        self.time_override: Callable[[], int] | None = None  # tests: Redis time in ms
        self._tasks: list[asyncio.Task[None]] = []
        self._ticker: asyncio.Task[None] | None = None
        self._subscribed: asyncio.Event | None = None
        # This Edge's lease durations: the wait estimate (R-QUEUE-3) with the shared view
        self.service = ServiceTimes(clock)
        self.affinity_hits: dict[str, int] = {}  # R-AFF-1: this Edge's keyed admissions
        self.affinity_misses: dict[str, int] = {}

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect, claim this Edge's id, install the policy, start the writer and the
        listener (and the renew/sweep ticker). Raises ``EdgeIdInUse``."""
        self._kick = asyncio.Event()
        timeout_s = max(1.0, self._ttl_s / 3)  # one Redis round trip at most
        store = connect.parse(self._url)
        self._redis = store.client(
            decode_responses=True,
            socket_connect_timeout=1.0,
            socket_timeout=timeout_s,
        )
        self._link = Link(store, timeout_s, hello=lambda: ("server", self._args([])))
        self._jobs.appendleft(self._apply_job(self._policy))
        try:
            await self._link.open()
            out = await self._call("start", [])
        except CONNECTION_ERRORS as exc:
            await self._disconnect()
            raise PoolBackendUnavailable(
                f"the shared pool's Redis does not answer ({type(exc).__name__})"
            ) from None
        if out[0] == "taken":
            await self._disconnect()
            raise EdgeIdInUse(f"another live Edge already uses the Edge id {self._edge!r}")
        self.fence = str(out[1])
        await background.start_tasks(self)

    async def aclose(self) -> None:
        """Send what is queued (releases, node_gone), give up this Edge's id, disconnect."""
        if self._expiry is not None:
            self._expiry.cancel()
        await background.stop_ticker(self)
        if self._redis is None:
            return
        if not self._down and not self.fenced:
            try:
                await asyncio.wait_for(self.flush(), timeout=2.0)
                key = f"{self._prefix}:alive:{self._edge}"
                if await self._redis.get(key) == self.fence:
                    await self._redis.delete(key)
            except STOP_ERRORS:
                log.warning("stopping with pool updates not sent; their leases expire by TTL")
        await background.stop_tasks(self)
        await self._disconnect()

    async def _disconnect(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()
        if self._link is not None:
            await self._link.aclose()
        self._redis, self._link = None, None

    async def flush(self) -> None:
        """Return once every call made so far reached Redis and its answer was handled."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(_: Any) -> None:
            if not fut.done():
                fut.set_result(None)

        self._submit(Job("", [], done))
        await fut

    # --- admission and release ------------------------------------------------------------

    async def acquire(
        self,
        model: str,
        needs: frozenset[str] = frozenset(),
        *,
        long: bool = False,
        owner: str | None = None,
        max_queued: int | None = None,
        exclude: frozenset[str] = frozenset(),
        on_queued: Callable[[Callable[[], int | None]], None] | None = None,
        affinity: tuple[str, float] | None = None,
    ) -> Lease:
        """Lease a provider of ``model`` able to serve ``needs``, waiting in the one global
        queue (R-POOL-5 across Edges); ``PoolBackendUnavailable`` at once when Redis is
        unreachable, ``PoolRecovering`` while it recovers from a loss of data. A waiter's
        position is not known here without a read of Redis: ``on_queued`` is not called
        (its queue events carry the estimate only, R-QUEUE-4)."""
        if self._down or self.fenced:
            raise PoolBackendUnavailable()
        fut: asyncio.Future[Lease] = asyncio.get_running_loop().create_future()
        share = "" if owner is None or max_queued is None else str(max_queued)
        args = [
            model,
            json.dumps(sorted(needs)),
            "1" if long else "0",
            owner or "",
            share,
            json.dumps(sorted(exclude)),
            *affinity_args(affinity),
        ]
        counted = None if affinity is None else model  # R-AFF-1: hits and misses per group
        admitted = partial(answers.admitted, self, fut, model, long, counted)
        self._submit(Job("admit", args, admitted, fut))
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release(fut.result())  # granted in the same tick as the cancel: no leak
            raise

    def release(self, lease: Lease) -> bool:
        """Give the lease back; True the first time, False after (R-POOL-9). Synchronous."""
        if lease._released:
            return False
        lease._released = True
        held = self._held.pop(lease.request_id, None)
        if held is not None and held[0] is lease:
            self._submit(Job("release", [str(lease.request_id)]))
        self.service.took(lease.provider_id, lease.started)
        return True

    @property
    def affinity_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """(hits, misses) per model group of this Edge's requests with an affinity key."""
        return self.affinity_hits, self.affinity_misses

    def estimate_wait(
        self, model: str, needs: frozenset[str] = frozenset(), long: bool = False
    ) -> float | None:
        """Seconds a request arriving now would wait (R-QUEUE-3), from the shared view (at
        most ``VIEW_MAX_AGE_S`` old) and this Edge's measured lease durations."""
        pids = set(self._policy.groups.get(model, ()))
        rows = [r for r in self.snapshot().providers if r.provider_id in pids and r.online]
        if not rows:
            return None
        if any(r.in_flight < r.capacity and not r.ejected_for_s for r in rows):
            return 0.0
        ahead = min(self._view.queue_depth, sum(r.queued for r in rows))
        return self.service.wait(ahead, ((r.provider_id, r.capacity) for r in rows))

    def drain_s(self) -> float | None:
        """Seconds until the shared queue drains at this Edge's measured rates (R-QUEUE-1)."""
        view = self.snapshot()
        live = ((r.provider_id, r.capacity) for r in view.providers if r.online)
        return self.service.drain(view.queue_depth, live)

    def succeeded(self, lease: Lease) -> None:
        """The lease's upstream answered (R-HEALTH-2); call before ``release``."""
        args = ["ok", str(lease.request_id), lease.node_id, lease.provider_id]
        self._submit(Job("health", args, partial(answers.health_done, self)))

    def failed(self, lease: Lease, reason: str, retry_after_s: float | None = None) -> None:
        """The lease's run failed before its first byte (R-HEALTH-2); call before ``release``."""
        retry = "" if retry_after_s is None else str(max(0, round(retry_after_s * 1000)))
        args = ["fail", str(lease.request_id), lease.node_id, lease.provider_id, reason, retry]
        self._submit(Job("health", args, partial(answers.health_done, self)))

    def probed(self, node_id: str, provider_id: str, ok: bool, reason: str = "") -> None:
        """An active probe's verdict from the provider's Node (R-HEALTH-3)."""
        args = ["probe", node_id, provider_id, "1" if ok else "0", reason]
        self._submit(Job("health", args, partial(answers.health_done, self)))

    def wake(self) -> int:
        """Let providers whose ejection is over take a trial (any Edge may; the sweep does it
        too). The count is not known synchronously: returns 0."""
        now = self._clock()
        for pid, until in list(self._ejected_until.items()):
            if until <= now:  # being woken: the health timer must not fire again for it
                del self._ejected_until[pid]
        self._submit(Job("health", ["wake"], partial(answers.health_done, self)))
        return 0

    def next_wake(self) -> float | None:
        """When the earliest ejection this Edge knows of ends, on this Edge's clock."""
        return min(self._ejected_until.values(), default=None)

    @property
    def ejections_total(self) -> dict[str, int]:
        """Ejections this Edge's calls caused, per provider id (a per-Edge counter)."""
        return self._ejections

    # --- nodes and policy -----------------------------------------------------------------

    def node_ready(
        self, node_id: str, generation: int, refused: Mapping[str, str] | None = None
    ) -> None:
        """A Node connected here is dispatch-ready; the newest ready wins across Edges."""
        if self._nodes.mark_ready(node_id, generation, refused):
            args = ["ready", node_id, str(generation), wire.refused_json(refused or {})]
            self._submit(Job("node", args))

    def node_refused(self, node_id: str, generation: int, refused: Mapping[str, str]) -> None:
        """The ready Node now refuses exactly ``refused``."""
        if self._nodes.mark_refused(node_id, generation, refused):
            args = ["refused", node_id, str(generation), wire.refused_json(refused)]
            self._submit(Job("node", args))

    def node_gone(self, node_id: str, generation: int) -> None:
        """The connection ended; a ready Node of another (edge, generation) is untouched."""
        if self._nodes.mark_gone(node_id, generation):
            self._submit(Job("node", ["gone", node_id, str(generation), "{}"]))

    def apply(self, policy: PoolPolicy) -> None:
        """Install a policy in Redis unless a newer version is there (R-REF-3)."""
        self._policy = policy
        self._submit(self._apply_job(policy))

    def expire(self) -> int:
        """Time out overdue waiters now (of every Edge); the count is not known at once: 0."""
        self._submit(Job("expire", [], partial(answers.expired, self)))
        return 0

    # --- views ----------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """The last global figures read (a read is started when older than
        ``VIEW_MAX_AGE_S``): for gauges; a reader that needs a bound awaits
        ``fresh_snapshot``."""
        self._refresh_view()
        return self._view

    async def fresh_snapshot(self) -> PoolSnapshot:
        """Global figures read at most ``VIEW_MAX_AGE_S`` ago (R-SCALE-8): an older view is
        read from Redis first (concurrent readers share one read), within
        ``VIEW_READ_TIMEOUT_S``, else ``PoolBackendUnavailable``: never a stale view."""
        if self._clock() - self._view_at < VIEW_MAX_AGE_S:
            return self._view
        if self._down or self.fenced or self._kick is None:
            raise PoolBackendUnavailable()
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self.fetch_snapshot())
        try:
            return await asyncio.wait_for(asyncio.shield(self._reading), VIEW_READ_TIMEOUT_S)
        except (TimeoutError, PoolBackendUnavailable):
            raise PoolBackendUnavailable() from None

    @property
    def reachable(self) -> bool:
        """False from the first call Redis did not answer until one it answers again."""
        return not self._down and not self.fenced

    def idle(self) -> bool:
        """No lease held and no waiter queued by this Edge."""
        return not self._held and not self._waiters and not any(j.acquire for j in self._jobs)

    def queued_by(self, owner: str) -> int:
        """Waiters ``owner`` holds in the one queue, from the view (R-PRIN-3)."""
        self._refresh_view()
        return self._owners.get(owner, 0)

    async def fetch_snapshot(self) -> PoolSnapshot:
        """Exact global figures, after every call this Edge made so far."""
        fut: asyncio.Future[PoolSnapshot] = asyncio.get_running_loop().create_future()
        sent = self._clock()

        def done(out: Any) -> None:
            answers.viewed(self, out, sent)
            if not fut.done():
                fut.set_result(self._view)

        self._submit(Job("snapshot", [], done))
        return await fut

    # --- internals ------------------------------------------------------------------------

    def _apply_job(self, policy: PoolPolicy) -> Job:
        def done(out: Any) -> None:
            if out == "stale":
                log.info("pool policy version %d not installed: Redis has a newer one",
                         policy.version)  # fmt: skip
            if self.on_health_change is not None:
                self.on_health_change()

        return Job("apply", [wire.policy_json(policy)], done)

    def renew(self) -> None:
        """Re-assert this Edge's leases, Nodes and id now (the ticker does it every TTL/3)."""
        background.renew(self)

    def sweep(self) -> None:
        """Expire what nobody renewed and end ejections now (every Edge does it every TTL/3)."""
        background.sweep(self)

    def _refresh_view(self) -> None:
        if (
            self._background
            and self._kick is not None
            and "snapshot" not in self._pending
            and self._clock() - self._view_at >= VIEW_MAX_AGE_S
            and not self._down
        ):
            self._pending.add("snapshot")
            then = partial(answers.viewed, self, sent=self._clock())
            self._submit(Job("snapshot", [], self._periodic("snapshot", then)))

    def _periodic(self, name: str, then: Callable[[Any], None]) -> Callable[[Any], None]:
        def done(out: Any) -> None:
            self._pending.discard(name)
            then(out)

        return done

    def _arm_expiry(self, delay: float | None = None) -> None:
        """One timer at this Edge's oldest waiter's deadline; the script decides on Redis
        time, and answers how long is left when the two clocks disagree."""
        timeout = self._policy.queue_timeout_ms / 1000.0
        if not self._background or not self._waiters or not timeout:
            return
        if delay is None:
            oldest = min(w.since for w in self._waiters.values())
            delay = max(0.0, oldest + timeout - self._clock())
        if self._expiry is not None:
            self._expiry.cancel()
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(max(delay, 0.005), self.expire)

    def _args(self, extra: list[str]) -> list[str]:
        now = "" if self.time_override is None else str(self.time_override())
        ttl = str(round(self._ttl_s * 1000))
        return [self._prefix, self._edge, ttl, now, self.fence or "", *extra]

    async def _call(self, name: str, extra: list[str]) -> Any:
        assert self._link is not None
        return self._answer((await self._send([Job(name, extra)]))[0])

    async def _send(self, jobs: list[Job]) -> list[Any]:
        """Run ``jobs``' scripts in order in one round trip; a script's error is its answer.
        A lease's ``succeeded`` directly followed by its release is one call (``release``
        with ``+``): the same effects in the same order, one script less per request."""
        assert self._link is not None
        calls = wire.fold(jobs)
        if not calls:
            return []
        raws = await self._link.run([(name, self._args(args)) for name, args, _ in calls])
        if self._link.hello_answer is not None:
            hello, self._link.hello_answer = self._link.hello_answer, None
            try:
                background.server_checked(self._answer(hello))
            except Exception as exc:  # fenced or a script error: the batch's answers say it
                log.warning("checking the shared pool store's server failed: %r", exc)
        return wire.unfold(calls, raws, len(jobs))

    def _answer(self, raw: Any) -> Any:
        """Handle one script's result: epoch, health log lines, waiter fates; its own part."""
        if isinstance(raw, Exception):
            raise raw
        res = json.loads(raw)
        if "fenced" in res:
            raise EdgeFenced(
                f"the Edge id {self._edge!r} was taken over by a newer process "
                f"(fence {res['fenced']}; this one has {self.fence})"
            )
        epoch = res["e"]
        if self._epoch is None:
            self._epoch = epoch
        elif epoch != self._epoch:
            self._epoch = epoch
            background.lost_data(self)
        for info in wire.items(res["info"]):
            answers.health_info(self, info)
        for ev in wire.items(res["ev"]):
            answers.fate(self, ev)
        return res["r"]

    def _submit(self, job: Job) -> None:
        if self.fenced:  # nothing of a fenced process reaches Redis (R-SCALE-4)
            if job.acquire is not None and not job.acquire.done():
                job.acquire.set_exception(PoolBackendUnavailable())
            if job.script == "" and job.done is not None:
                job.done(None)  # a barrier: nothing is left to wait for
            return
        self._jobs.append(job)
        if self._kick is not None:
            self._kick.set()


if TYPE_CHECKING:

    def _is_an_engine(pool: RedisPool) -> PoolEngine:
        return pool  # mypy checks that RedisPool satisfies the PoolEngine Protocol
