"""How a ``RedisPool`` handles the answers of its scripts: leases for its callers, fates of
its waiters (granted, failed; a late or early message), health log lines and the view."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from pool.engine.model import Lease

from . import wire
from .jobs import Job

if TYPE_CHECKING:
    from .pool import RedisPool

health_log = logging.getLogger("iop.pool.health")
RECENT = 4096  # waiter ids remembered after their fate, so a late duplicate is ignored


@dataclass(slots=True)
class Waiting:
    """A queued request of this Edge: its caller's future."""

    fut: asyncio.Future[Lease]
    model: str
    since: float  # this Edge's clock


def admitted(pool: RedisPool, fut: asyncio.Future[Lease], model: str, long: bool, out: Any) -> None:
    """The admit script's answer: a lease, a queued waiter, or a refusal."""
    kind = out[0]
    if kind == "lease":
        lease = Lease(int(out[1]), out[2], out[3], model, long, pool.service.now())
        pool._held[lease.request_id] = (lease, pool._epoch or "")
        if fut.done():
            pool.release(lease)  # the caller went away while the admit was on its way
        else:
            fut.set_result(lease)
    elif kind == "queued":
        wid = out[1]
        if fut.done():
            cancel(pool, wid)
            return
        pool._waiters[wid] = Waiting(fut, model, pool._clock())
        fut.add_done_callback(partial(waiter_done, pool, wid))
        early = pool._early.pop(wid, None)
        if early is not None:
            fate(pool, early)
        pool._arm_expiry()
    elif not fut.done():
        fut.set_exception(wire.error(out[1], out[2]))


def fate(pool: RedisPool, ev: list[Any]) -> None:
    """A waiter of this Edge was granted (``g``) or failed (``f``)."""
    wid = str(ev[1])
    w = pool._waiters.pop(wid, None)
    if w is None:
        if wid not in pool._recent and len(pool._early) < RECENT:
            pool._early[wid] = ev  # its admit answer is still on its way
        return
    remember(pool, wid)
    if ev[0] == "g":
        lease = Lease(int(wid), ev[2], ev[3], w.model, bool(ev[4]), pool.service.now())
        pool._held[lease.request_id] = (lease, str(ev[5]))
        if w.fut.done():
            pool.release(lease)
        else:
            w.fut.set_result(lease)
    elif not w.fut.done():
        w.fut.set_exception(wire.error(ev[2], ev[3]))
    if not pool._waiters and pool._expiry is not None:
        pool._expiry.cancel()
        pool._expiry = None


def waiter_done(pool: RedisPool, wid: str, fut: asyncio.Future[Lease]) -> None:
    if fut.cancelled() and pool._waiters.pop(wid, None) is not None:
        cancel(pool, wid)


def cancel(pool: RedisPool, wid: str) -> None:
    """Out of the queue; a lease a pump already granted it is released (R-POOL-9)."""
    remember(pool, wid)
    pool._submit(Job("cancel", [wid], partial(cancelled, pool)))


def cancelled(pool: RedisPool, out: Any) -> None:
    if out[0] == "granted":
        lease = Lease(int(out[1]), out[2], out[3], "", bool(out[4]))
        pool._held[lease.request_id] = (lease, str(out[5]))
        pool.release(lease)


def remember(pool: RedisPool, wid: str) -> None:
    pool._early.pop(wid, None)
    pool._recent[wid] = None
    if len(pool._recent) > RECENT:
        pool._recent.popitem(last=False)


def health_done(pool: RedisPool, out: Any) -> None:
    if out and pool.on_health_change is not None:
        pool.on_health_change()


def expired(pool: RedisPool, left_ms: Any) -> None:
    if pool._waiters and isinstance(left_ms, (int, float)) and left_ms >= 0:
        pool._arm_expiry(left_ms / 1000.0)


def health_info(pool: RedisPool, info: list[Any]) -> None:
    """One log line per change of a provider's health (R-HEALTH-4)."""
    kind, pid, before, ms, reason = info
    if kind == "ejected":
        pool._ejected_until[pid] = pool._clock() + float(ms) / 1000.0
        pool._ejections[pid] = pool._ejections.get(pid, 0) + 1
        health_log.warning(
            "provider %s: %s -> ejected for %.0f s: %s", pid, before, ms / 1000, reason
        )
    elif kind == "probing":
        pool._ejected_until.pop(pid, None)
        health_log.info("provider %s: ejected -> probing: one trial request", pid)
    else:
        pool._ejected_until.pop(pid, None)
        health_log.info("provider %s: %s -> healthy (%s)", pid, before, reason)


def viewed(pool: RedisPool, out: Any, sent: float) -> None:
    """A snapshot read sent at ``sent`` (this Edge's clock): its figures are that old."""
    pool._view = wire.snapshot(out)
    pool._view_at = max(pool._view_at, sent)
    pool._owners = {o: int(n) for o, n in wire.items(out["owners"])}
    now = pool._clock()
    rows = pool._view.providers
    ejected = {r.provider_id: now + r.ejected_for_s for r in rows if r.health == "ejected"}
    changed = ejected.keys() != pool._ejected_until.keys()
    pool._ejected_until = ejected
    if changed and pool.on_health_change is not None:
        pool.on_health_change()
