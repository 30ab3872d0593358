"""The one scheduling loop (Kueue's shape). Handlers and the API only record facts and wake it
(`JobStore.wake_scheduler`: a Postgres NOTIFY delivered when their transaction commits, so the
loop never looks before the fact is visible); it also runs every `cycle_interval_s` (waits age,
wait targets come due). One cycle: snapshot -> pure `policy.cycle` -> apply the decisions
(GPU ids, segments, preemption requests) and publish, in one transaction; then the queue
forecast (positions, estimated starts) that the job views show is refreshed from the new state."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from whetstone.runtime.service import Runtime

from ..adapters.metrics import SchedulerMetrics
from ..adapters.store import JobStore
from ..domain import jobs as rules
from ..domain.cluster import ClusterView, pick_gpu_ids
from ..domain.job_data import PlacedPart
from ..domain.forecast import forecast
from ..domain.policy import cycle
from ..domain.snapshot import Assignment

if TYPE_CHECKING:
    from ..context import SchedulerContext

CYCLE_LOCK = 42
TIERS = ("premium", "standard", "free")


class SchedulingLoop:
    def __init__(self) -> None:
        self._wake = asyncio.Event()
        self.cycles = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self, rt: Runtime[SchedulerContext]) -> None:
        """Background task: wait for a wake-up (or the interval), run a cycle, repeat."""
        assert rt.pool is not None
        interval = rt.ctx.config.cycle_interval_s
        async with JobStore.wakes(rt.pool, self.wake):
            self.wake()   # whatever was recorded before this process started
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=interval)
                except TimeoutError:
                    pass
                self._wake.clear()   # facts recorded from here on wake the next cycle
                await run_cycle(rt)
                self.cycles += 1


async def run_cycle(rt: Runtime[SchedulerContext]) -> int:
    ctx, cfg = rt.ctx, rt.ctx.config
    began = time.perf_counter()
    placed = 0
    async with rt.uow() as uow:
        store = JobStore(uow)
        await store.lock_cycle(CYCLE_LOCK)
        now = ctx.clock()
        view = await store.cluster(now, now - cfg.node_timeout, cfg.queue_scan, cfg.checkpoint_s)
        observe_queue(ctx.metrics, view)
        if not view.snapshot.queue:
            ctx.forecasts = {}
            return 0
        result = cycle(view.snapshot, ctx.policy)
        for p in result.preemptions:
            await request_preemption(rt, store, p.job_id, "priority",
                                     f"preempted for higher-priority job {p.for_job_id}", p.for_job_id)
        for a in result.assignments:
            if await assign(rt, store, view, a):
                placed += 1
                ctx.metrics.assigned.labels(how="backfill" if a.backfilled else "in_order").inc()
        ctx.metrics.decisions.inc(result.decisions)
    if placed or result.preemptions:
        async with rt.uow() as uow:
            now = ctx.clock()
            view = await JobStore(uow).cluster(now, now - cfg.node_timeout, cfg.queue_scan, cfg.checkpoint_s)
    ctx.forecasts = forecast(view.snapshot, ctx.policy, cfg.forecast_limit)
    ctx.metrics.cycle_seconds.observe(time.perf_counter() - began)
    return placed


def observe_queue(m: SchedulerMetrics, view: ClusterView) -> None:
    now = view.snapshot.now
    for tier in TIERS:
        waiting = [now - j.queued_at for j in view.snapshot.queue if j.tier == tier]
        m.queue_depth.labels(tier=tier).set(len(waiting))
        m.oldest_wait.labels(tier=tier).set(max(waiting, default=0.0))


async def assign(rt: Runtime[SchedulerContext], store: JobStore, view: ClusterView, a: Assignment) -> bool:
    job = await store.get(a.job_id, lock=True)
    if job is None or job.status != rules.QUEUED:
        return False
    waited = max((rt.ctx.clock() - job.updated_at).total_seconds(), 0.0)   # since it (re-)entered the queue
    placement = [PlacedPart(node_id=n, gpu_ids=pick_gpu_ids(n, g, view)) for n, g in a.placement.nodes]
    addresses = await store.addresses([p.node_id for p in placement]) if len(placement) > 1 else {}
    events = job.assign(rt.ctx.clock(), placement, a.placement.shape, a.placement.spot, a.backfilled,
                        rt.ctx.config.default_runtime_s, addresses)
    await store.save(job)
    await store.publish(job, events)
    if events:
        store.uow.after_commit(lambda: rt.ctx.metrics.queue_wait.labels(tier=job.tier).observe(waited))
    return bool(events)


async def request_preemption(rt: Runtime[SchedulerContext], store: JobStore, job_id: str, reason: str, message: str,
                             for_job: str | None = None) -> bool:
    """Tell the job's node(s) to checkpoint and stop (job.preempt_requested); the agent's own
    job.preempted (emergency checkpoint on SIGTERM) then re-queues it. Meanwhile the cycle counts
    its GPUs as freeing soon. A job busy in another transaction is left to the next cycle."""
    job = await store.get(job_id, skip_locked=True)
    if job is None or job.preempt_requested_at is not None:
        return False
    events = job.request_preemption(rt.ctx.clock(), reason, message, for_job)
    if job.preempt_requested_at is None:
        return False
    await store.save(job)
    await store.publish(job, events)
    rt.log.warning("preemption requested", job_id=job_id, reason=reason, for_job=for_job, nodes=job.node_ids)
    rt.ctx.metrics.preemptions.labels(reason=reason).inc()
    return True
