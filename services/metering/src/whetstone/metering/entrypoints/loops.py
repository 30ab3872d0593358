"""Background loops: the grace-period sweep and the usage gauges' refresh."""

from __future__ import annotations

import asyncio

from whetstone.runtime.service import Runtime

from ..context import MeteringContext
from ..usecases.metering import event_now
from ..usecases.sweep import sweep_once


async def sweep_forever(rt: Runtime[MeteringContext]) -> None:
    interval = rt.ctx.config.sweep_interval_s
    while True:
        await asyncio.sleep(interval)
        await sweep_once(rt)


async def refresh_forever(rt: Runtime[MeteringContext]) -> None:
    """The usage gauges, read from the ledger's roll-ups, with how far the consumed streams have got."""
    metrics = rt.ctx.usage_metrics
    assert metrics is not None, "bootstrap.on_start binds the gauges before the loops start"
    interval = rt.ctx.config.metrics_interval_s
    while True:
        assert rt.pool is not None
        wall = rt.clock()
        await metrics.refresh(rt.pool, wall)
        metrics.event_time.set((await event_now(rt, wall)).timestamp())
        metrics.partitions_behind.set(sum(1 for left in (rt.consumer_lag or {}).values() if left != 0))
        await asyncio.sleep(interval)
