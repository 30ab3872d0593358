"""Serving's background loop: follow the projection as its changes commit."""

from __future__ import annotations

import asyncio

from whetstone.runtime.service import Runtime

from ..context import ServingContext
from ..usecases.projection import sync_projection

FALLBACK_POLL_S = 2.0  # only if a notification was lost (listener connection broke)


async def follow_projection(rt: Runtime[ServingContext]) -> None:
    """Act on committed projection changes as soon as their NOTIFY arrives. Adapters that were
    servable before this process started load on their first request."""
    ctx = rt.ctx
    async with ctx.repo.changes_notified(ctx.projection_changed.set):
        while True:
            ctx.projection_changed.clear()
            await sync_projection(rt, act=True)  # first round: what committed before the listener started
            try:
                await asyncio.wait_for(ctx.projection_changed.wait(), timeout=FALLBACK_POLL_S)
            except TimeoutError:
                pass
