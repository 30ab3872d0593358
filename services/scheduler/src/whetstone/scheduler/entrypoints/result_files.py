"""A job's `result_files`: ingest builds the results CSV from the bus when training ends and announces it
(file.created); the job lists it from then on."""

from __future__ import annotations

from whetstone.contracts import Envelope, FileCreatedV1
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters.store import JobStore
from ..context import SchedulerContext
from .handlers import own_job


async def on_file_created(rt: Runtime[SchedulerContext], uow: UnitOfWork, env: Envelope, ev: FileCreatedV1) -> None:
    if not ev.job_id:
        return
    store = JobStore(uow)
    job = own_job(env, await store.get(ev.job_id, lock=True), "file.created")
    if job is not None and job.result_file_made(rt.ctx.clock(), ev.file_id):
        await store.save(job)
