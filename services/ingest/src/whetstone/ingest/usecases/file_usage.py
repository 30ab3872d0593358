"""Which jobs use which file (so DELETE /v1/files/{id} can refuse), projected from the scheduler's
events: a queued job marks its training file in use; a terminal event releases it."""

from __future__ import annotations

from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters.files import FileStore
from ..context import IngestContext


async def job_started_using(rt: Runtime[IngestContext], uow: UnitOfWork, tenant_id: str, file_id: str,
                            job_id: str) -> None:
    await FileStore(uow.conn).job_started_using(tenant_id, file_id, job_id, rt.clock())


async def job_ended(rt: Runtime[IngestContext], uow: UnitOfWork, tenant_id: str, job_id: str) -> None:
    await FileStore(uow.conn).job_ended(tenant_id, job_id, rt.clock())
