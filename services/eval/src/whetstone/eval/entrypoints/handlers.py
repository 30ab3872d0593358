"""Eval handlers: project the job and its final checkpoint, and request an evaluation once both
are known; take `eval.requested` commands (a re-evaluation on a new base SHA) as runs of their own.
Cheap and transactional; the scoring itself runs in the worker (`worker.py`, `usecases/evaluate.py`),
outside any transaction and off the consumer's partition."""

from __future__ import annotations

from whetstone.contracts import (
    CheckpointWrittenV1,
    Envelope,
    EvalRequestedV1,
    JobCancelledV1,
    JobQueuedV1,
    NodeFencedV1,
)
from whetstone.contracts.enums import CheckpointKind
from whetstone.runtime import fencing
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import PoisonMessage, Runtime

from ..adapters.repository import EvalStore
from ..context import EvalContext
from ..domain.requests import request_run_id
from ..domain.runs import EvalJob, FinalCheckpoint


async def on_job_queued(rt: Runtime[EvalContext], uow: UnitOfWork, env: Envelope, ev: JobQueuedV1) -> None:
    await EvalStore(uow.conn).save_job(EvalJob(job_id=ev.job_id, tenant_id=env.tenant_id, spec=ev.spec, tier=ev.tier,
                                               suffix=ev.suffix))
    await _request(rt, uow, ev.job_id)


async def on_checkpoint_written(rt: Runtime[EvalContext], uow: UnitOfWork, env: Envelope,
                                ev: CheckpointWrittenV1) -> None:
    """The final checkpoint of the job's newest attempt is evaluated; a fenced or superseded attempt's
    is refused (dead-lettered as `stale_attempt`): it never reaches the gate."""
    if ev.kind != CheckpointKind.FINAL:
        return
    store = EvalStore(uow.conn)
    fenced = await fencing.fenced_attempt(uow.conn, ev.job_id, env.tenant_id)
    if fencing.cancelled(fenced):   # the node wrote it before it heard the cancel: never evaluated
        rt.log.info("final checkpoint of a cancelled job not evaluated", job_id=ev.job_id, uri=ev.uri)
        return
    why = fencing.stale_reason(ev.job_id, ev.attempt, fenced, await store.final_attempt(ev.job_id))
    if why:
        raise PoisonMessage(f"final checkpoint {ev.uri} not evaluated: {why}", reason="stale_attempt")
    await store.save_final_checkpoint(FinalCheckpoint(job_id=ev.job_id, tenant_id=env.tenant_id, uri=ev.uri,
                                                      manifest_sha256=ev.manifest_sha256, trace_id=env.trace_id,
                                                      attempt=ev.attempt))
    if (attempt := fencing.attempt_or_first(ev.attempt)) > 1:
        await store.supersede_runs(ev.job_id, env.tenant_id, attempt - 1)
    await _request(rt, uow, ev.job_id)


async def on_node_fenced(rt: Runtime[EvalContext], uow: UnitOfWork, env: Envelope, ev: NodeFencedV1) -> None:
    """The scheduler gave up on an attempt: its final checkpoint (if it came first) is dropped and its
    run, unless already answered, ends without an answer; the next attempt's checkpoint is evaluated."""
    store = EvalStore(uow.conn)
    fenced = await fencing.record_fence(uow.conn, ev.job_id, env.tenant_id, ev.attempt)
    dropped = await store.forget_fenced_checkpoint(ev.job_id, env.tenant_id, fenced)
    superseded = await store.supersede_runs(ev.job_id, env.tenant_id, fenced)
    if dropped or superseded:
        rt.log.warning("fenced attempt's evaluation dropped", job_id=ev.job_id, attempt=fenced,
                       checkpoint_dropped=dropped, runs_superseded=superseded)


async def on_job_cancelled(rt: Runtime[EvalContext], uow: UnitOfWork, env: Envelope, ev: JobCancelledV1) -> None:
    """Cancel wins: the job is fenced whole, its final checkpoint (if it came first) dropped and its
    evaluation, unless already answered, ends without an answer (the worker publishes nothing for a
    checkpoint that is no longer the job's). A gang's cancel names each node: the first one does it."""
    store = EvalStore(uow.conn)
    await fencing.record_fence(uow.conn, ev.job_id, env.tenant_id, fencing.CANCELLED)
    dropped = await store.forget_fenced_checkpoint(ev.job_id, env.tenant_id, fencing.CANCELLED)
    superseded = await store.supersede_job_runs(ev.job_id, env.tenant_id)
    if dropped or superseded:
        rt.log.warning("cancelled job's evaluation dropped", job_id=ev.job_id, checkpoint_dropped=dropped,
                       runs_superseded=superseded)


async def _request(rt: Runtime[EvalContext], uow: UnitOfWork, job_id: str) -> None:
    if await EvalStore(uow.conn).request_eval_if_ready(job_id):
        rt.log.info("evaluation requested", job_id=job_id)
        uow.after_commit(rt.ctx.wakeup.set)  # the worker must see the committed run


async def on_eval_requested(rt: Runtime[EvalContext], uow: UnitOfWork, env: Envelope, ev: EvalRequestedV1) -> None:
    """A run keyed by the request id (apart from the job's own run); a redelivered command adds nothing."""
    run_id = request_run_id(env.tenant_id, ev.request_id)
    if await EvalStore(uow.conn).add_request(run_id, env.tenant_id, ev, env.trace_id):
        rt.log.info("evaluation requested by command", job_id=ev.job_id, request_id=ev.request_id,
                    base_model=ev.base_model, base_model_sha256=ev.base_model_sha256)
        uow.after_commit(rt.ctx.wakeup.set)  # the worker must see the committed run
    else:
        rt.log.info("eval request already taken; not run again", request_id=ev.request_id)
