"""The random sequences of tests/test_pool_state_machine.py against ``RedisPool`` on a real
Redis, checked against the same reference model (R-POOL-1..9, R-REF-3, R-NODE-1/3,
R-HEALTH-1..3, R-PRIN-3, R-SCALE-2).

The machine drives the pool through its public API and, after every call, runs the loop until
Redis answered and every fate was delivered; Redis time is the machine's clock (whole
milliseconds), so deadlines and ejections end exactly when the model says.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from pool.engine import Lease, PoolError, PoolPolicy, PoolSnapshot
from pool.engine_redis import RedisPool
from tests import test_pool_state_machine as base
from tests.support.examples import SLOW_PROPERTY_TIMEOUT_S, examples
from tests.support.redis_pool import REDIS_URL, drop_keys, needs_redis, new_prefix, settled_epoch

BASE_MS = 1_000_000_000_000  # Redis time of the machine's t = 0 (the epoch is long settled)


class _RedisCore:
    """The pool as the synchronous core the base machine's rules drive: every call is
    followed by ``settle`` (Redis answered, fates recorded, an exact snapshot read)."""

    def __init__(self, machine: RedisPoolMachine) -> None:
        self.m = machine
        self.pool = machine.pool

    def release(self, lease: Lease) -> bool:
        released = self.pool.release(lease)
        self.m.settle()
        return released

    def failed(self, lease: Lease, reason: str, retry_after_s: float | None = None) -> None:
        self.pool.failed(lease, reason, retry_after_s)
        self.m.settle()

    def succeeded(self, lease: Lease) -> None:
        self.pool.succeeded(lease)
        self.m.settle()

    def probed(self, node_id: str, provider_id: str, ok: bool, reason: str = "") -> None:
        self.pool.probed(node_id, provider_id, ok, reason)
        self.m.settle()

    def wake(self, now: float | None = None) -> None:
        self.pool.wake()
        self.m.settle()

    def expire(self, now: float | None = None) -> None:
        self.pool.expire()
        self.m.settle()

    def node_ready(self, node_id: str, generation: int) -> None:
        self.pool.node_ready(node_id, generation)
        self.m.settle()

    def node_gone(self, node_id: str, generation: int) -> None:
        self.pool.node_gone(node_id, generation)
        self.m.settle()

    def apply(self, policy: PoolPolicy) -> None:
        self.pool.apply(policy)
        self.m.settle()

    def cancel(self, task: Any) -> bool:
        if task.done():
            return False
        task.cancel()
        self.m.settle()
        return True

    def snapshot(self) -> PoolSnapshot:
        self.m.snap = self.m.loop.run_until_complete(self.pool.fetch_snapshot())
        return self.m.snap

    def queued_by(self, owner: str) -> int:
        return self.pool.queued_by(owner)  # from the snapshot ``settle`` read

    def idle(self) -> bool:
        return self.pool.idle()


class RedisPoolMachine(base.PoolMachine):
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.prefix = new_prefix()
        settled_epoch(REDIS_URL, self.prefix)
        self.pool = RedisPool(
            base.INITIAL,
            redis_url=REDIS_URL,
            prefix=self.prefix,
            edge_id="edge-a",
            lease_ttl_s=3600.0,  # the machine renews nothing: its Edge stays alive meanwhile
            background=False,  # the machine fires every timer itself
        )
        self.pool.time_override = lambda: BASE_MS + round(self.now * 1000)
        # A second Edge, only to hold Nodes: locality (R-SCALE-5) prefers edge-a's own.
        self.other = RedisPool(
            base.INITIAL,
            redis_url=REDIS_URL,
            prefix=self.prefix,
            edge_id="edge-b",
            lease_ttl_s=3600.0,
            background=False,
        )
        self.other.time_override = self.pool.time_override
        self.other_gen = 0
        self.completed: list[tuple[int, asyncio.Task[Lease]]] = []
        self.admitting: int | None = None
        self.snap = PoolSnapshot((), 0, 0.0)
        self.now = 0.0
        self.loop.run_until_complete(self.pool.start())
        self.loop.run_until_complete(self.other.start())
        super().__init__()
        self.core = _RedisCore(self)  # type: ignore[assignment]
        for node in base.NODES:
            self.core.node_ready(node, 1)

    # --- driving the loop ----------------------------------------------------------------

    def settle(self) -> None:
        """Run the loop until every call reached Redis and its answer was handled."""

        async def drain() -> PoolSnapshot:
            async with asyncio.timeout(10):
                return await drained()

        async def drained() -> PoolSnapshot:
            for _ in range(10):
                await self.pool.flush()
                for _ in range(3):
                    await asyncio.sleep(0)
                if not self.pool._jobs:
                    break
            return await self.pool.fetch_snapshot()

        self.snap = self.loop.run_until_complete(drain())
        done, self.completed = self.completed, []
        for n, task in done:
            if task.cancelled() or n == self.admitting:
                continue
            del self.waiting[task]  # type: ignore[arg-type]
            exc = task.exception()
            if exc is None:
                lease = task.result()
                self.check_within_capacity(lease)
                self.held.append((n, lease))
                self.on_end(n, ("grant", lease.node_id, lease.provider_id))
            else:
                assert isinstance(exc, PoolError), exc
                self.on_end(n, ("fail", exc.code))

    def compare(self) -> None:
        assert self.step_events == self.ref.events
        self.step_events, self.ref.events = [], []

    # --- rules of this machine only -------------------------------------------------------

    @rule(node=st.sampled_from(base.NODES))
    def node_ready_on_another_edge(self, node: str) -> None:
        """R-SCALE-5: the Node connects to edge-b: its providers stay live for edge-a's
        requests, which prefer edge-a's own Nodes among equals."""
        self.other_gen += 1
        self.other.node_ready(node, self.other_gen)
        self.loop.run_until_complete(self.other.flush())
        self.ref.node_ready_elsewhere(node)
        self.pool.renew()  # edge-a reads its waiters' fates decided by edge-b's script
        self.settle()
        self.compare()

    # --- rules that differ ----------------------------------------------------------------

    def positions_and_free_slots_match_model(self) -> None:
        """Not an invariant here: the Redis engine tells no queue position without a read of
        Redis (R-QUEUE-4), and estimates from its last shared view (tests/test_pool_redis.py
        covers that estimate)."""

    def admit_one(
        self,
        model: str,
        needs: frozenset[str],
        long: bool,
        owner: str | None,
        exclude: frozenset[str] = frozenset(),
        affinity: tuple[str, float] | None = None,
    ) -> None:
        self.n += 1
        n = self.n
        share = self.shares.get(owner) if owner is not None else None
        expected = self.ref.admit(n, model, needs, long, owner, share, exclude, affinity)
        task = self.loop.create_task(
            self.pool.acquire(
                model,
                needs,
                long=long,
                owner=owner,
                max_queued=share,
                exclude=exclude,
                affinity=affinity,
            )
        )
        task.add_done_callback(lambda t, n=n: self.completed.append((n, t)))
        self.admitting = n
        try:
            self.settle()
        finally:
            self.admitting = None
        self.compare()  # expiries triggered by the arrival come first
        if not task.done():
            assert expected is None
            self.waiting[task] = n  # type: ignore[index]
            return
        exc = task.exception()
        if exc is not None:
            assert type(exc) is expected, (exc, expected)
            self.on_end(n, ("error", exc.code))  # type: ignore[attr-defined]
            return
        lease = task.result()
        assert expected == (lease.node_id, lease.provider_id)
        self.check_within_capacity(lease)
        self.held.append((n, lease))
        self.on_end(n, ("lease", lease.node_id, lease.provider_id))

    @precondition(lambda self: self.waiting and self.held)
    @rule(i=st.integers(0, 50), j=st.integers(0, 50))
    def cancel_in_dispatch_tick(self, i: int, j: int) -> None:
        """R-POOL-9: the caller goes away in the tick a release is made. Redis cannot know
        the caller left, so the release may grant it; its Edge then releases that lease."""
        task, n = list(self.waiting.items())[i % len(self.waiting)]
        del self.waiting[task]
        self.on_end(n, ("cancelled",))
        m, lease = self.held.pop(j % len(self.held))
        queued = next(w for w in self.ref.waiters if w.n == n)
        task.cancel()  # type: ignore[attr-defined]
        assert self.pool.release(lease) is True
        self.released.append(lease)
        self.ref.release((lease.node_id, lease.provider_id), lease.long, m)
        grant = next((e for e in self.ref.events if e[:2] == ("grant", n)), None)
        if grant is None:
            self.ref.cancel(n)
        else:
            self.ref.events.remove(grant)
            self.ref.release((str(grant[2]), str(grant[3])), queued.long, n)
        self.settle()
        self.compare()

    def teardown(self) -> None:
        try:
            for task, n in list(self.waiting.items()):
                task.cancel()  # type: ignore[attr-defined]
                self.on_end(n, ("cancelled",))
            self.waiting.clear()
            self.settle()
            while self.held:
                _, lease = self.held.pop()
                assert self.pool.release(lease)
            self.settle()
            assert self.pool.idle()
            assert all(self.pool.queued_by(owner) == 0 for owner in base.OWNERS[1:])
            assert sorted(self.fate) == list(range(1, self.n + 1))
            snap = self.snap
            assert snap.queue_depth == 0
            assert all(r.in_flight == r.long_in_flight == r.queued == 0 for r in snap.providers)
        finally:
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.pool.aclose())
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(self.other.aclose())
            self.loop.close()
            drop_keys(REDIS_URL, self.prefix)


RedisPoolMachine.TestCase.settings = settings(
    max_examples=examples(100),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_redis_pool_matches_reference_model = needs_redis(
    pytest.mark.timeout(SLOW_PROPERTY_TIMEOUT_S)(RedisPoolMachine.TestCase)
)
