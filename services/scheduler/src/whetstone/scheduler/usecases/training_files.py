"""The training files jobs may use: a create naming a deleted, rejected, unknown or another
tenant's file is refused at once (400, param training_file); `dataset.deleted` fails the jobs whose
admission crossed the delete and that are not on a node yet (ingest refuses a delete with 409
`file_in_use` once it has heard of a job queued on the file)."""

from __future__ import annotations

from whetstone.contracts import DatasetDeletedV1, Envelope
from whetstone.runtime.file_ids import file_id_key, minted_for
from whetstone.runtime.identity import internal_secret
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.service import Runtime

from ..adapters.store import JobStore
from ..context import SchedulerContext
from ..domain import files
from ..domain import jobs as rules

def minted(rt: Runtime[SchedulerContext], file_id: str, tenant_id: str) -> bool:
    """Whether the platform minted `file_id` for this tenant: with the file-id key, or (ids minted before
    the file-id key was split from it) with the internal secret itself, which the scheduler holds."""
    data_dir = rt.settings.data_dir
    return minted_for(file_id, tenant_id, file_id_key(data_dir)) or minted_for(file_id, tenant_id,
                                                                              internal_secret(data_dir))


# a job still waiting for the file, or queued again for another segment, would read it: it fails
NOT_STARTED = (rules.VALIDATING, rules.QUEUED, rules.PREEMPTED)


async def refusal(rt: Runtime[SchedulerContext], store: JobStore, tenant_id: str, file_id: str,
                  dataset: files.DatasetRecord | None, param: str = files.FILE_PARAM) -> rules.Rejection | None:
    """Why a job of this tenant cannot use this file as its `param` (training_file or validation_file;
    read under the tenant's admission lock, which `on_dataset_deleted` takes too: a create and a
    delete of the same file are ordered)."""
    submitted, deleted = await store.file_seen(tenant_id, file_id)
    return files.refusal(files.FileFacts(
        file_id, dataset.status if dataset is not None else None, dataset.errors if dataset is not None else (),
        submitted, deleted, minted(rt, file_id, tenant_id)), param)


async def on_dataset_deleted(rt: Runtime[SchedulerContext], uow: UnitOfWork, env: Envelope,
                             ev: DatasetDeletedV1) -> None:
    """The file is gone: remembered for the tenant, and its jobs not on a node yet fail. A deletion of a
    file the envelope's tenant never uploaded is dead-lettered as tenant_mismatch."""
    store = JobStore(uow)
    if not minted(rt, ev.dataset_id, env.tenant_id) and not await store.dataset_known(env.tenant_id, ev.dataset_id):
        raise PoisonMessage(f"dataset.deleted names {ev.dataset_id}, which tenant {env.tenant_id!r} never uploaded",
                            reason="tenant_mismatch")
    await store.lock_tenant(env.tenant_id)
    await store.dataset_deleted(env.tenant_id, ev.dataset_id, env.occurred_at)
    for job_id in await store.jobs_on_file(env.tenant_id, ev.dataset_id, NOT_STARTED):
        job = await store.get(job_id, lock=True)
        if job is None or job.status not in NOT_STARTED:
            continue
        events = job.fail(rt.ctx.clock(), "training_file_deleted",
                          f"training_file {ev.dataset_id!r} was deleted before the job started training",
                          param=files.FILE_PARAM)
        await store.save(job)
        await store.publish(job, events)
        rt.log.info("job failed: its training file was deleted", job_id=job.job_id, file_id=ev.dataset_id)
