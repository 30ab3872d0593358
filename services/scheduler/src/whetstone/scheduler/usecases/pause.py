"""Pausing and resuming a job (`POST /v1/fine_tuning/jobs/{id}/pause` and `/resume`), for every method.

Pause: a queued job leaves the queue; a job on a node takes the preemption path with reason `pause`
(`job.preempt_requested` -> the node's emergency checkpoint -> its `job.preempted`), and the handler of
that report parks it as paused (`Job.preempted`) instead of re-queueing it. No refund, no failure:
metering bills the stopped segment like any other and keeps the job open.
Resume: the job re-enters the queue through the one queueing use case (`admission.enter_queue`: quota,
sort key, position, the loop woken) and its next assignment resumes from its latest checkpoint."""

from __future__ import annotations

from whetstone.contracts import CostEstimate
from whetstone.runtime.service import Runtime

from ..adapters.store import JobStore
from ..context import SchedulerContext
from ..domain import jobs as rules
from ..domain.job import Job
from ..domain.pausing import pause_refusal, resume_refusal
from .admission import enter_queue


class PauseConflict(Exception):
    """The job's state does not allow it (409); the message names the state."""


async def pause_job(rt: Runtime[SchedulerContext], store: JobStore, job: Job) -> None:
    """Pause the job (already paused or pausing: unchanged); PauseConflict when it cannot be."""
    if why := pause_refusal(job):
        raise PauseConflict(why)
    events = job.pause(rt.ctx.clock())
    await store.save(job)
    await store.publish(job, events)
    if events:
        rt.ctx.metrics.preemptions.labels(reason="pause").inc()
        rt.log.info("pause requested", job_id=job.job_id, nodes=job.node_ids)


async def resume_job(rt: Runtime[SchedulerContext], store: JobStore, job: Job) -> rules.Rejection | None:
    """Queue a paused job again (the quota's verdict on the rest of its work: the Rejection when over
    the hard cap, the job staying paused); PauseConflict when it is not paused."""
    if why := resume_refusal(job):
        raise PauseConflict(why)
    assert job.spec is not None, "a paused job was queued once, so it has its spec"
    runtime_s = job.estimated_runtime_s or rt.ctx.config.default_runtime_s
    remaining_s = runtime_s * (1 - job.progress.fraction())
    gpu_hours = remaining_s * job.shapes[0].total / 3600.0
    queued = await enter_queue(rt, store, job, job.spec, runtime_s, gpu_hours,
                               CostEstimate(remaining_runtime_s=round(remaining_s, 1)))
    if isinstance(queued, rules.Rejection):
        return queued
    await store.save(job)
    await store.publish(job, queued)
    return None
