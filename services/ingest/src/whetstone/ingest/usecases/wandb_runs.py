"""W&B offline runs (OpenAI's `wandb` integration, offline): a job that asked for one gets, beside its results
CSV, a second result file `<job>-wandb-offline.tar.gz` holding a W&B offline run with the same figures.

The handlers only record and queue, in their event's transaction: job.queued records the plan, the making of
the results file queues the run, a step read later queues it again, a cancel drops it. The SDK runs in
`write_claimed`, called by the W&B worker: claim (a lease), write the run in the SDK's own process and put the
tarball in the tenant's prefix with no transaction open, then record the file and publish file.created in one
short transaction. A worker that dies after the upload leaves its claim to run out: the next one writes the
same object again, and the file is recorded once (under the row's lock, where the run holds no file yet)."""

from __future__ import annotations

import asyncio
import hashlib

from whetstone.contracts import FileCreatedV1, JobQueuedV1
from whetstone.contracts.enums import IntegrationType
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.s3 import tenant_prefix
from whetstone.runtime.service import Runtime

from ..adapters.files import FileStore
from ..adapters.results import ResultsStore
from ..adapters.wandb_offline import write_offline_run
from ..adapters.wandb_runs import WandbRunClaim, WandbRunStore
from ..context import IngestContext
from ..domain.results import RESULTS_PURPOSE
from ..domain.wandb_runs import WandbPlan, run_input, wandb_file_id_for, wandb_filename

Rt = Runtime[IngestContext]


def plan_of(ev: JobQueuedV1) -> WandbPlan | None:
    block = next((i.wandb for i in ev.integrations if i.type == IntegrationType.WANDB and i.wandb), None)
    if block is None:
        return None
    return WandbPlan(job_id=ev.job_id, wandb=block, base_model=ev.spec.base_model,
                     base_model_sha256=ev.spec.base_model_sha256, method=ev.spec.method.value,
                     hyperparameters=ev.spec.hyperparameters, dataset_id=ev.spec.dataset_id, suffix=ev.suffix)


async def remember(rt: Rt, uow: UnitOfWork, tenant_id: str, ev: JobQueuedV1) -> None:
    """job.queued: keep the job's W&B plan (none asked: nothing)."""
    if (plan := plan_of(ev)) is None:
        return
    state = await ResultsStore(uow.conn).state(tenant_id, ev.job_id)
    if state == "cancelled":   # read after the job's cancel: it makes no result file
        return
    if await WandbRunStore(uow.conn).remember(tenant_id, plan, results_made=state == "made"):
        uow.after_commit(rt.ctx.wandb_wakeup.set)


async def queue(rt: Rt, uow: UnitOfWork, tenant_id: str, job_id: str) -> None:
    """The results file was made: the job's W&B run (where it asked for one) is to be written."""
    if await WandbRunStore(uow.conn).queue(tenant_id, job_id):
        uow.after_commit(rt.ctx.wandb_wakeup.set)


async def steps_changed(rt: Rt, uow: UnitOfWork, tenant_id: str, job_id: str) -> None:
    """A step read after the results file was made: the W&B run is written again."""
    if await WandbRunStore(uow.conn).steps_changed(tenant_id, job_id):
        uow.after_commit(rt.ctx.wandb_wakeup.set)


async def cancel(uow: UnitOfWork, tenant_id: str, job_id: str) -> None:
    await WandbRunStore(uow.conn).cancel(tenant_id, job_id)


async def write_claimed(rt: Rt, claim: WandbRunClaim) -> None:
    """Write the claimed run and record its result file; raises where the SDK failed (the worker releases)."""
    tenant_id, job_id = claim.tenant_id, claim.job_id
    file_id, filename = wandb_file_id_for(job_id), wandb_filename(job_id)
    async with rt.uow() as uow:   # a short read, over before the SDK runs
        rows = await ResultsStore(uow.conn).rows(tenant_id, job_id)
        deleted = claim.file_id is not None and await FileStore(uow.conn).get(tenant_id, claim.file_id) is None
    if deleted:   # the tenant deleted the file: it is not written again
        async with rt.uow() as uow:
            await WandbRunStore(uow.conn).finish(claim, None)
        return
    body = await write_offline_run(run_input(claim.plan, rows), rt.ctx.config.wandb_timeout_s)
    sha256 = hashlib.sha256(body).hexdigest()
    key = f"{tenant_prefix(tenant_id)}results/{job_id}/{filename}"
    uri = await asyncio.to_thread(rt.store.put_bytes, key, body, "application/gzip")   # same key on a retry
    async with rt.uow() as uow:
        runs = WandbRunStore(uow.conn)
        recorded = await runs.file_of(claim)
        if not await runs.finish(claim, file_id):
            rt.log.warning("W&B run abandoned: another worker holds it now", job_id=job_id)
            return
        if recorded is None:
            await FileStore(uow.conn).add(tenant_id, file_id, filename=filename, purpose=RESULTS_PURPOSE,
                                          dataset_purpose=RESULTS_PURPOSE, size=len(body), sha256=sha256,
                                          source_uri=uri, now=rt.clock())
            await uow.publish(FileCreatedV1(file_id=file_id, filename=filename, size_bytes=len(body), job_id=job_id,
                                            uri=uri), tenant_id=tenant_id)
            rt.log.info("W&B offline run file made", job_id=job_id, file_id=file_id, steps=len(rows))
        else:
            await ResultsStore(uow.conn).rewritten(tenant_id, recorded, len(body), sha256)

