"""What runs beside the requests of a ``RedisPool``: the one ordered writer, the listener of
this Edge's channel, the renew/sweep ticker, and the handling of an outage or a loss of data
(docs/pool.md, "Redis engine")."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections import deque
from functools import partial
from typing import TYPE_CHECKING, Any

from redis import exceptions as redis_errors

from pool.engine.errors import PoolBackendUnavailable
from pool.engine.readiness import Readiness

from . import answers, wire
from .jobs import Job

if TYPE_CHECKING:
    from .pool import RedisPool

from .pool_errors import EdgeFenced

log = logging.getLogger("iop.pool.redis")

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    OSError,
)
RETRY_S = 0.25  # how often an unreachable Redis is tried again
BATCH = 64  # jobs sent in one pipeline: concurrent requests of one Edge share a round trip
HOLD_S = 0.002  # a lone lease end waits at most this for the next call to ride with it
STOP_WAIT_S = 0.5  # a stopping task is cancelled again after this
STOP_TRIES = 20


async def start_tasks(pool: RedisPool) -> None:
    pool._subscribed = asyncio.Event()
    pool._tasks = [
        asyncio.create_task(write(pool), name="pool-writer"),
        asyncio.create_task(listen(pool), name="pool-listener"),
    ]
    if pool._background:
        pool._ticker = asyncio.create_task(tick(pool), name="pool-ticker")
    # A grant published by another Edge must find this Edge subscribed.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(pool._subscribed.wait(), timeout=2.0)


async def stop_ticker(pool: RedisPool) -> None:
    if pool._ticker is not None:
        await stopped(pool._ticker)
        pool._ticker = None


async def stop_tasks(pool: RedisPool) -> None:
    for task in pool._tasks:
        task.cancel()
    for task in pool._tasks:
        await stopped(task)
    pool._tasks = []


async def stopped(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` until it has ended. A writer was seen going on after its cancel (in
    whole-suite runs, under load): it went back to waiting for work, and its stop waited
    forever. The stop is asked again every ``STOP_WAIT_S``, a bounded number of times."""
    for _ in range(STOP_TRIES):
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STOP_WAIT_S)
        if done:
            if not task.cancelled() and task.exception() is not None:
                log.warning("pool task %s ended with %r", task.get_name(), task.exception())
            return
        log.info("pool task %s still running after a cancel: cancelling again", task.get_name())
    log.warning("pool task %s did not stop after %d cancels", task.get_name(), STOP_TRIES)


def renew(pool: RedisPool) -> None:
    """Re-assert this Edge's leases, Nodes and id; look up its waiters' fates."""
    if "renew" in pool._pending:
        return
    pool._pending.add("renew")
    body = {
        "leases": [
            [str(i), lease.provider_id, lease.node_id, 1 if lease.long else 0, epoch]
            for i, (lease, epoch) in pool._held.items()
        ],
        "nodes": [
            [node, str(gen), wire.refused_json(pool._nodes.refused.get(node, {}))]
            for node, gen in pool._nodes.ready.items()
        ],
        "waiters": list(pool._waiters),
    }
    done = pool._periodic("renew", partial(_renewed, pool))
    pool._submit(Job("renew", [json.dumps(body)], done))


def sweep(pool: RedisPool) -> None:
    """Expire what nobody renewed, drop dead Edges' waiters, end ejections, pump."""
    if "sweep" not in pool._pending:
        pool._pending.add("sweep")
        pool._submit(Job("sweep", [], pool._periodic("sweep", lambda _: None)))


def _renewed(pool: RedisPool, out: Any) -> None:
    lost = wire.items(out["lost"])
    for i in lost:
        pool._held.pop(int(i), None)  # its slot went to another request: not counted again
    if lost:
        log.warning("%d lease(s) expired in Redis before this Edge renewed them", len(lost))
    if out["version"] is False:
        pool.apply(pool._policy)  # Redis lost the policy: this Edge's is re-asserted


def lost_data(pool: RedisPool) -> None:
    """A new epoch: Redis lost its data. Leases and Nodes are re-asserted at once; new
    admissions wait for the grace (``pool_recovering``) so nothing is over-admitted."""
    log.warning("the shared pool store lost its data: re-asserting this Edge's leases")
    renew(pool)
    pool.apply(pool._policy)


def check_server(pool: RedisPool) -> None:
    """Ask whether the store is still the server its epoch was born on (R-HA-2): on every new
    connection (``Link``'s hello) and every TTL/3 here, for a server whose identity changed
    under a connection that stayed open."""
    if "server" not in pool._pending:
        pool._pending.add("server")
        pool._submit(Job("server", [], pool._periodic("server", server_checked)))


def server_checked(out: Any) -> None:
    """The ``server`` script's answer: a log line when the store's server is not the one its
    epoch was born on (its new epoch re-asserts, as ``lost_data``)."""
    if out and out[0] == "new":
        log.warning(
            "the shared pool store is another server than before (a promoted replica or a "
            "restart): its data may have gone back in time, a new epoch begins (R-HA-2)"
        )


async def tick(pool: RedisPool) -> None:
    period = pool._ttl_s / 3
    while True:
        await asyncio.sleep(period)
        if not pool._down:
            check_server(pool)
            renew(pool)
            pool.sweep()


async def write(pool: RedisPool) -> None:
    """The one writer: jobs reach Redis in call order, up to ``BATCH`` per round trip (one
    pipeline); an outage keeps them for later."""
    assert pool._kick is not None
    while True:
        if not pool._jobs:
            pool._kick.clear()
            await pool._kick.wait()
            continue
        if _only_ends(pool):
            await _hold(pool)
        batch = list(itertools.islice(pool._jobs, BATCH))
        sent = [j for j in batch if j.script and not (j.acquire and j.acquire.done())]
        try:
            raws = await pool._send(sent)
        except CONNECTION_ERRORS as exc:
            await _outage(pool, exc)
            continue
        answers = {id(job): raw for job, raw in zip(sent, raws, strict=True)}
        for job in batch:
            if pool._jobs and pool._jobs[0] is job:
                pool._jobs.popleft()
            out: Any = None
            if job.script:
                if id(job) not in answers:
                    continue  # an admission whose caller went away before it was sent
                try:
                    out = pool._answer(answers[id(job)])
                except EdgeFenced:
                    fenced(pool)
                    return  # the writer stops: nothing more of this process reaches Redis
                except Exception:  # a script error or a bug: this job fails, the writer goes on
                    log.exception("pool script %s failed", job.script)
                    if job.acquire is not None and not job.acquire.done():
                        job.acquire.set_exception(PoolBackendUnavailable())
                    continue
            if job.done is not None:
                try:
                    job.done(out)
                except Exception:
                    log.exception("handling the answer of pool script %s failed", job.script)


def _only_ends(pool: RedisPool) -> bool:
    """Only lease ends are queued (verdicts and releases: nobody awaits them), this Edge has
    no waiter and the last view an empty queue: nobody is known to wait for that capacity."""
    return (
        not pool._waiters
        and pool._view.queue_depth == 0
        and all(j.script == "release" or (j.script == "health" and j.args[0] in ("ok", "fail"))
                for j in pool._jobs)
    )  # fmt: skip


async def _hold(pool: RedisPool) -> None:
    """Wait up to ``HOLD_S`` for another call: at c=1 the next request's admission comes
    within it, and the previous request's end rides in its round trip, ahead of it."""
    assert pool._kick is not None
    pool._kick.clear()
    timer = asyncio.get_running_loop().call_later(HOLD_S, pool._kick.set)
    try:
        await pool._kick.wait()
    finally:
        timer.cancel()


def fenced(pool: RedisPool) -> None:
    """Another process took this Edge's id over (R-SCALE-4): this one holds nothing any more.
    Every call fails, nothing more reaches Redis (the leases expire there by TTL, the routed
    runs are cancelled by their owners as for a dead Edge), and ``on_fenced`` is told once."""
    if pool.fenced:
        return
    pool.fenced = True
    log.critical(
        "this Edge's id %r was taken over by a newer process (R-SCALE-4): it stops serving",
        pool._edge,
    )
    for job in pool._jobs:
        if job.acquire is not None and not job.acquire.done():
            job.acquire.set_exception(PoolBackendUnavailable())
        elif job.script == "" and job.done is not None:
            job.done(None)  # a barrier (flush): nothing is left to wait for
    pool._jobs.clear()
    for w in pool._waiters.values():
        if not w.fut.done():
            w.fut.set_exception(PoolBackendUnavailable())
    pool._waiters.clear()
    pool._held.clear()
    pool._nodes = Readiness()
    if pool._ticker is not None:
        pool._ticker.cancel()
    if pool.on_fenced is not None:
        pool.on_fenced()


async def _outage(pool: RedisPool, exc: BaseException) -> None:
    """Admissions and this Edge's waiters fail with 503 ``pool_unavailable`` at once;
    every other call is kept and sent, in order, once Redis answers again."""
    pool._down = True
    log.warning(
        "the shared pool store is unreachable (%s): admissions answer 503 pool_unavailable",
        type(exc).__name__,
    )
    kept: deque[Job] = deque()
    for job in pool._jobs:
        if job.acquire is None:
            kept.append(job)
        elif not job.acquire.done():
            job.acquire.set_exception(PoolBackendUnavailable())
    pool._jobs = kept
    for wid, w in list(pool._waiters.items()):
        del pool._waiters[wid]
        if not w.fut.done():
            w.fut.set_exception(PoolBackendUnavailable())
        answers.cancel(pool, wid)  # its queue entry goes once Redis is back
    pool._pending.clear()
    assert pool._redis is not None
    while True:
        await asyncio.sleep(RETRY_S)
        try:
            await pool._redis.ping()
            break
        except CONNECTION_ERRORS:
            continue
    pool._down = False
    log.info("the shared pool store answers again")
    renew(pool)


async def listen(pool: RedisPool) -> None:
    """Fates of this Edge's waiters decided by other Edges' scripts (R-POOL-5)."""
    assert pool._redis is not None and pool._subscribed is not None
    channel = f"{pool._prefix}:edge:{pool._edge}:pool"
    while True:
        pubsub = pool._redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            async for msg in pubsub.listen():
                if msg["type"] == "subscribe":
                    pool._subscribed.set()
                elif msg["type"] == "message":
                    answers.fate(pool, json.loads(msg["data"]))
        except CONNECTION_ERRORS:
            await asyncio.sleep(RETRY_S)
            if pool._subscribed.is_set() and pool._waiters:
                renew(pool)  # a message may have been lost meanwhile
        finally:
            with contextlib.suppress(*CONNECTION_ERRORS):
                await pubsub.aclose()
