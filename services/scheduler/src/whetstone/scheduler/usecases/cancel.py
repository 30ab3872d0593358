"""Cancelling a job (`POST /v1/fine_tuning/jobs/{id}/cancel`): the job's cancel transition, saved with
its events; the scheduling loop is woken when the job held nodes."""

from __future__ import annotations

from whetstone.runtime.service import Runtime

from ..adapters.store import JobStore
from ..context import SchedulerContext
from ..domain.job import Job


async def cancel_job(rt: Runtime[SchedulerContext], store: JobStore, job: Job) -> bool:
    had_nodes = bool(job.nodes_held())
    events = job.cancel(rt.ctx.clock())
    if not events:
        return False
    await store.save(job)
    await store.publish(job, events)
    if had_nodes:
        await store.wake_scheduler()
    return True
