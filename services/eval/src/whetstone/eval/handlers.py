"""Eval handlers: project the job and its final checkpoint, and request an evaluation once both
are known; take `eval.requested` commands (a re-evaluation on a new base SHA) as runs of their own.
Cheap and transactional; the scoring itself runs in `worker.py`, outside any transaction and off
the consumer's partition."""

from __future__ import annotations

from whetstone.contracts import CheckpointWrittenV1, Envelope, EvalRequestedV1, JobQueuedV1
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from .adapters import repository
from .context import EvalContext
from .domain.requests import request_run_id


async def on_job_queued(rt: Runtime[EvalContext], uow: UnitOfWork, env: Envelope, ev: JobQueuedV1) -> None:
    spec = ev.spec.model_dump(mode="json")
    # the lineage suffix: wherever the producer put it (job.queued top level or spec; absent: none)
    spec["suffix"] = spec.get("suffix") or env.payload.get("suffix") or (env.payload.get("spec") or {}).get("suffix")
    await repository.save_job(uow.conn, ev.job_id, env.tenant_id, spec, ev.tier)
    await _request(rt, uow, ev.job_id)


async def on_checkpoint_written(rt: Runtime[EvalContext], uow: UnitOfWork, env: Envelope,
                                ev: CheckpointWrittenV1) -> None:
    if ev.kind != "final":
        return
    await repository.save_final_checkpoint(uow.conn, ev.job_id, env.tenant_id, ev.uri, ev.manifest_sha256,
                                           env.trace_id)
    await _request(rt, uow, ev.job_id)


async def _request(rt: Runtime[EvalContext], uow: UnitOfWork, job_id: str) -> None:
    if await repository.request_eval_if_ready(uow.conn, job_id):
        rt.log.info("evaluation requested", job_id=job_id)
        uow.after_commit(rt.ctx.wakeup.set)  # the worker must see the committed run


async def on_eval_requested(rt: Runtime[EvalContext], uow: UnitOfWork, env: Envelope, ev: EvalRequestedV1) -> None:
    """A run keyed by the request id (apart from the job's own run); a redelivered command adds nothing."""
    run_id = request_run_id(env.tenant_id, ev.request_id)
    if await repository.add_request(uow.conn, run_id, ev.job_id, env.tenant_id, ev.model_dump(mode="json"),
                                    env.trace_id):
        rt.log.info("evaluation requested by command", job_id=ev.job_id, request_id=ev.request_id,
                    base_model=ev.base_model, base_model_sha256=ev.base_model_sha256)
        uow.after_commit(rt.ctx.wakeup.set)  # the worker must see the committed run
    else:
        rt.log.info("eval request already taken; not run again", request_id=ev.request_id)
