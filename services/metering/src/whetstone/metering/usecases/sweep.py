"""Time-based decisions: jobs whose grace periods ran out (event time)."""

from __future__ import annotations

from whetstone.runtime.service import Runtime

from ..adapters.partitions import ownership
from ..adapters.store import LedgerStore
from ..context import MeteringContext
from .metering import METERED_TOPICS, event_now, lock_and_load, settle_and_write


async def sweep_once(rt: Runtime[MeteringContext], limit: int = 2000) -> int:
    """Settle this replica's jobs whose grace ran out: unknown-job anomalies, segments that never stopped,
    totals to close. A replica settles only the jobs of the partitions it holds (adapters/partitions.py):
    its event clock measures those partitions, and another replica's jobs may still have events waiting
    in partitions it does not read. Returns how many jobs it looked at."""
    policy = rt.ctx.policy
    assert policy is not None, "bootstrap.on_start binds the policy before the sweep starts"
    held = rt.assigned_partitions()
    if held is None:
        return 0
    assigned, counts = held
    owner = ownership(assigned, counts, METERED_TOPICS)
    if owner is None:
        return 0
    wall = rt.clock()
    now = await event_now(rt, wall)
    async with rt.uow() as uow:
        store = LedgerStore(uow.conn)
        ids = await store.jobs_due(now - policy.close_grace, now - policy.orphan_grace, owner, limit)
        if not ids:
            return 0
        cache = rt.ctx.state_cache
        states, versions = await lock_and_load(store, ids, None, wall, cache)
        await settle_and_write(rt, uow, store, states, versions, now, set(), set(), cache=cache)
    return len(ids)
