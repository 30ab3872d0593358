"""A service stops within the 30 s a pod gets after SIGTERM even when a part of it will not: each of
the runtime's steps of the stop is bounded and the one that overran is named (before, one stuck step
used the whole budget and the service was left behind, still running). The service's own on_stop (a
trainer's drain) is not cut short by those bounds."""

from __future__ import annotations

import asyncio
import time

import pytest

from whetstone.runtime.service import Service

pytestmark = pytest.mark.integration


def stubborn() -> Service:
    async def handler(rt, uow, env, ev):
        return None

    async def on_stop(rt) -> None:           # a drain longer than any of the runtime's own steps' bounds
        await asyncio.sleep(5)
        rt.drained = True

    async def deaf(rt) -> None:              # a background task that ignores its cancellation once
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(3600)

    return Service(name="stubborn", subscriptions={"job.progress": handler}, on_stop=on_stop, background=[deaf])


async def test_a_stuck_step_is_cut_short_and_named_so_the_service_still_stops(settings, platform):
    async with platform(stubborn) as p:
        rt = p["stubborn"]
        assert rt.http.port
        began = time.monotonic()
    took = time.monotonic() - began
    assert took < 15, took                   # the drain (5 s), then the background tasks cut short (4 s)
    assert rt.drained and rt.stop_overran == ["background tasks"], rt.stop_overran
    assert rt.pool._closed                   # the rest of the stop still ran: the pool is closed
