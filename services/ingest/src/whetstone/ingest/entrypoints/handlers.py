"""Ingest's message handlers: each parses nothing more than its contract model and calls one use case.

dataset.submitted queues an upload's validation (`usecases/submissions.py`); the scheduler's job events
keep which jobs use a file (`usecases/file_usage.py`); job.progress and checkpoint.written collect each
step's figures and the end of training makes the job's results file (`usecases/results.py`); job.queued
records a `wandb` integration, whose offline run becomes a second result file (`usecases/wandb_runs.py`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from whetstone.contracts import (
    CheckpointWrittenV1, DatasetSubmittedV1, Envelope, JobCancelledV1, JobCompletedV1, JobFailedV1, JobProgressV1,
    JobQueuedV1,
)
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..context import IngestContext
from ..domain.results import checkpoint_values, progress_values
from ..usecases import file_usage, results, submissions, wandb_runs

Rt = Runtime[IngestContext]
Handler = Callable[[Rt, UnitOfWork, Envelope, Any], Awaitable[None]]


async def on_dataset_submitted(rt: Rt, uow: UnitOfWork, env: Envelope, ev: DatasetSubmittedV1) -> None:
    await submissions.submit(rt, uow, env.tenant_id, str(env.event_id), env.trace_id, ev)


async def on_job_queued(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobQueuedV1) -> None:
    await file_usage.job_started_using(rt, uow, env.tenant_id, ev.spec.dataset_id, ev.job_id)
    await wandb_runs.remember(rt, uow, env.tenant_id, ev)


async def on_job_progress(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobProgressV1) -> None:
    await results.record(rt, uow, env.tenant_id, ev.job_id, ev.step, ev.attempt, progress_values(ev.model_dump()))


async def on_checkpoint_written(rt: Rt, uow: UnitOfWork, env: Envelope, ev: CheckpointWrittenV1) -> None:
    await results.record(rt, uow, env.tenant_id, ev.job_id, ev.step, ev.attempt, checkpoint_values(ev.metrics))


async def on_training_ended(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobCompletedV1 | JobFailedV1) -> None:
    """The end of training releases the file and makes the job's results file."""
    await file_usage.job_ended(rt, uow, env.tenant_id, ev.job_id)
    await results.make_results_file(rt, uow, env.tenant_id, ev.job_id)


async def on_job_cancelled(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobCancelledV1) -> None:
    await file_usage.job_ended(rt, uow, env.tenant_id, ev.job_id)
    await results.cancel(uow, env.tenant_id, ev.job_id)


SUBSCRIPTIONS: dict[str, Handler] = {
    "dataset.submitted": on_dataset_submitted, "job.queued": on_job_queued, "job.progress": on_job_progress,
    "checkpoint.written": on_checkpoint_written, "job.completed": on_training_ended, "job.failed": on_training_ended,
    "job.cancelled": on_job_cancelled,
}
