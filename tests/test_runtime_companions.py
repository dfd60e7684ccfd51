"""What runs beside the Edge runtime in scale-out (the pool engine, the run router, the
revision watcher: iop_site.scale) starts in order once the loop runs and is closed after the
runtime, in reverse; one that cannot start closes those already started."""

from __future__ import annotations

import pytest

from catalog.config import load_snapshot
from iop_site.runtime import EdgeRuntime
from tests.support.inprocess import document


class Part:
    def __init__(self, name: str, events: list[str], *, fail: bool = False) -> None:
        self.name, self.events, self.fail = name, events, fail

    async def start(self) -> None:
        if self.fail:
            raise RuntimeError(f"{self.name} cannot start")
        self.events.append(f"start {self.name}")

    async def aclose(self) -> None:
        self.events.append(f"close {self.name}")


async def test_companions_start_in_order_and_close_in_reverse_after_the_runtime():
    events: list[str] = []
    runtime = EdgeRuntime(load_snapshot(document()))
    runtime.companions = [Part("engine", events), Part("router", events)]
    await runtime.start_companions()
    await runtime.start_companions()  # idempotent
    assert events == ["start engine", "start router"]
    await runtime.aclose()
    assert events == ["start engine", "start router", "close router", "close engine"]


async def test_a_companion_that_cannot_start_closes_the_started_ones_and_raises():
    events: list[str] = []
    runtime = EdgeRuntime(load_snapshot(document()))
    runtime.companions = [Part("engine", events), Part("router", events, fail=True)]
    with pytest.raises(RuntimeError, match="router cannot start"):
        await runtime.start_companions()
    assert events == ["start engine", "close engine"]
    await runtime.aclose()
    assert events == ["start engine", "close engine"]  # closed exactly once


async def test_without_scale_out_the_runtime_has_no_companions_r_scale_1():
    from iop_site import scale

    runtime = EdgeRuntime(load_snapshot(document()))
    assert scale.companions(runtime, scale=scale.ScaleSettings(), edge_id="e") == []
    await runtime.aclose()
