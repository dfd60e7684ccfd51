"""What crosses between the Edge and the pool scripts: policy and requests as JSON in,
script results and waiter fates out (docs/pool.md, "Redis engine")."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pool.engine.errors import (
    NotAdmitted,
    PoolBackendUnavailable,
    PoolError,
    PoolRecovering,
    QueueFull,
    QueueTimeout,
    Unavailable,
    UnknownModel,
)
from pool.engine.model import PoolPolicy, PoolSnapshot, ProviderStatus

_ERRORS: dict[str, type[PoolError]] = {
    cls.code: cls
    for cls in (
        NotAdmitted,
        PoolBackendUnavailable,
        PoolRecovering,
        QueueFull,
        QueueTimeout,
        Unavailable,
        UnknownModel,
    )
}


if TYPE_CHECKING:
    from .jobs import Job

Call = tuple[str, list[str], list[int]]  # script, arguments, the jobs it answers (in order)


def fold(jobs: Sequence[Job]) -> list[Call]:
    """The scripts to run for ``jobs``: a lease's health ``ok`` directly followed by the
    release of that lease becomes one ``release + id node provider``."""
    calls: list[Call] = []
    i = 0
    while i < len(jobs):
        job = jobs[i]
        after = jobs[i + 1] if i + 1 < len(jobs) else None
        if (
            job.script == "health"
            and job.args[0] == "ok"
            and after is not None
            and after.script == "release"
            and after.args == [job.args[1]]
        ):
            calls.append(("release", ["+", *job.args[1:4]], [i, i + 1]))
            i += 2
        else:
            calls.append((job.script, job.args, [i]))
            i += 1
    return calls


def unfold(calls: list[Call], raws: list[Any], jobs: int) -> list[Any]:
    """One answer per job again: a folded call's answer goes to its first job (the verdict),
    the release gets an empty one."""
    out: list[Any] = [None] * jobs
    for (_, _, indices), raw in zip(calls, raws, strict=True):
        out[indices[0]] = raw
        for index in indices[1:]:
            out[index] = raw if isinstance(raw, Exception) else _nothing(raw)
    return out


def _nothing(raw: Any) -> str:
    """An answer with nothing in it, of the same epoch as ``raw``."""
    return json.dumps({"e": json.loads(raw)["e"], "info": [], "ev": [], "r": None})


def error(code: str, message: str = "") -> PoolError:
    """The typed pool error of a script's code (an unknown code is ``Unavailable``)."""
    return _ERRORS.get(code, Unavailable)(message or None)


def items(value: Any) -> list[Any]:
    """A Lua array: cjson encodes an empty one as ``{}``."""
    return value if isinstance(value, list) else []


def policy_json(policy: PoolPolicy) -> str:
    """The policy as ``apply.lua`` reads it; times in whole milliseconds."""
    h = policy.health
    return json.dumps(
        {
            "version": policy.version,
            "max_queue": policy.max_queue,
            "timeout_ms": policy.queue_timeout_ms,
            "ej_after": h.eject_after_failures,
            "ej_base_ms": round(h.eject_base_s * 1000),
            "ej_max_ms": round(h.eject_max_s * 1000),
            "providers": [
                [
                    p.provider_id,
                    p.node_id,
                    p.capacity,
                    p.long_capacity,
                    p.priority,
                    1 if p.enabled else 0,
                    sorted(p.capabilities),
                    p.fingerprint,
                ]
                for p in policy.providers
            ],
            "groups": {model: list(pids) for model, pids in policy.groups.items()},
        }
    )


def refused_json(refused: Mapping[str, str]) -> str:
    return json.dumps(dict(refused)) if refused else "{}"


def snapshot(out: Mapping[str, Any]) -> PoolSnapshot:
    """``snapshot.lua``'s answer as the engine's snapshot type."""
    rows = tuple(
        ProviderStatus(
            node_id=r[0],
            provider_id=r[1],
            online=bool(r[2]),
            capacity=int(r[3]),
            in_flight=int(r[4]),
            long_in_flight=int(r[5]),
            queued=int(r[6]),
            priority=int(r[7]),
            enabled=bool(r[8]),
            long_capacity=int(r[9]),
            unavailable=r[10] or None,
            health=r[11],
            health_reason=r[12],
            ejected_for_s=float(r[13]) / 1000.0,
            consecutive_failures=int(r[14]),
        )
        for r in items(out["rows"])
    )
    return PoolSnapshot(rows, int(out["depth"]), float(out["oldest_ms"]))


def offline(policy: PoolPolicy) -> PoolSnapshot:
    """The view before the first read: every provider offline (R-POOL-8)."""
    rows = tuple(
        ProviderStatus(
            node_id=p.node_id,
            provider_id=p.provider_id,
            online=False,
            capacity=p.capacity,
            in_flight=0,
            long_in_flight=0,
            queued=0,
            priority=p.priority,
            enabled=p.enabled,
            long_capacity=p.long_capacity,
        )
        for p in sorted(policy.providers, key=lambda p: (p.node_id, p.provider_id))
    )
    return PoolSnapshot(rows, 0, 0.0)
