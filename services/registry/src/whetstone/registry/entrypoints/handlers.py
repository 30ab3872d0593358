"""The registry's message handlers: each parses its contract event and calls one use case."""

from __future__ import annotations

from whetstone.contracts import (
    CheckpointWrittenV1, Envelope, EvalCompletedV1, JobCancelledV1, JobFailedV1, JobProgressV1, JobQueuedV1,
    ModelMergedV1, NodeFencedV1,
)
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters.store import ModelStore
from ..context import RegistryContext
from ..domain.tracking import RunStatus
from ..usecases import base_models, merges, registration, tracking, withdrawal


async def on_job_queued(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: JobQueuedV1) -> None:
    await registration.job_queued(rt, uow, env.tenant_id, ev)
    await tracking.job_queued(rt, uow, env.tenant_id, ev, env.occurred_at)


async def on_job_progress(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: JobProgressV1) -> None:
    """A step's figures: only a job with experiment tracking keeps them (tracking.progress)."""
    await tracking.progress(rt, uow, ev, env.occurred_at)


async def on_job_failed(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: JobFailedV1) -> None:
    await tracking.job_ended(rt, uow, ev.job_id, RunStatus.FAILED, env.occurred_at)


async def on_checkpoint_written(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope,
                                ev: CheckpointWrittenV1) -> None:
    await registration.final_checkpoint(rt, uow, env.tenant_id, ev)


async def on_eval_completed(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: EvalCompletedV1) -> None:
    """A verdict about a job's final checkpoint, or the answer to a re-evaluation (`request_id`)."""
    if ev.request_id:
        await base_models.reeval_completed(rt, ModelStore(uow.conn), ev)
    else:
        # the verdict is queued for the job's run before registration can queue the run's end
        await tracking.eval_completed(rt, uow, ev, env.occurred_at)
        await registration.eval_completed(rt, uow, env.tenant_id, ev)


async def on_node_fenced(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: NodeFencedV1) -> None:
    await withdrawal.attempt_fenced(rt, uow, env.tenant_id, ev)


async def on_job_cancelled(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: JobCancelledV1) -> None:
    await withdrawal.job_cancelled(rt, uow, env.tenant_id, ev)
    await tracking.job_ended(rt, uow, ev.job_id, RunStatus.KILLED, env.occurred_at)


async def on_model_merged(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: ModelMergedV1) -> None:
    await merges.merge_answered(rt, uow, env.tenant_id, ev)
