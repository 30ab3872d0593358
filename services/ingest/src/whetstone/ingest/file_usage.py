"""Which jobs use which file (so DELETE /v1/files/{id} can refuse): projected from the scheduler's
events. job.queued marks the training file in use; a terminal event releases it."""

from __future__ import annotations

from whetstone.contracts import Envelope, JobCancelledV1, JobCompletedV1, JobFailedV1, JobQueuedV1
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from .adapters.files import FileStore
from .context import IngestContext


async def on_job_queued(rt: Runtime[IngestContext], uow: UnitOfWork, env: Envelope, ev: JobQueuedV1) -> None:
    await FileStore(uow.conn).job_started_using(env.tenant_id, ev.spec.dataset_id, ev.job_id, rt.clock())


async def on_job_ended(rt: Runtime[IngestContext], uow: UnitOfWork, env: Envelope,
                       ev: JobCompletedV1 | JobFailedV1 | JobCancelledV1) -> None:
    await FileStore(uow.conn).job_ended(env.tenant_id, ev.job_id, rt.clock())


SUBSCRIPTIONS = {"job.queued": on_job_queued, "job.completed": on_job_ended, "job.failed": on_job_ended,
                 "job.cancelled": on_job_ended}
