"""The trainer agent's message handlers: assignments for this node are recorded for the supervisor
(entrypoints/loops.py), which runs each segment as a child process group (usecases/segments.py);
cancels, preempt requests and fences act on the segments running here.

Guarantees: every checkpoint.written names a checkpoint whose manifest is stored; old
checkpoints are pruned only after that; every segment ends in exactly one of
job.completed / job.failed / job.preempted (a crash is a platform failure with the log
tail; a cancel a user failure; an agent stop a preemption from the last durable
checkpoint; an agent killed outright is reported preempted by its successor)."""

from __future__ import annotations

import signal

from whetstone.contracts import (
    Envelope,
    JobAssignedV1,
    JobCancelledV1,
    JobFailedV1,
    JobPreemptedV1,
    JobPreemptRequestedV1,
    NodeFencedV1,
)
from whetstone.contracts.enums import ErrorClass, PreemptionReason
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.s3 import within_tenant
from whetstone.runtime.service import PoisonMessage

from ..domain.runs import RunStatus
from ..usecases.segments import AgentRuntime


async def on_job_assigned(rt: AgentRuntime, uow: UnitOfWork, env: Envelope, ev: JobAssignedV1) -> None:
    ctx = rt.ctx
    if ev.node_id != ctx.config.node_id:
        return
    for field, uri in (("spec.train_uri", ev.spec.train_uri), ("spec.validation_uri", ev.spec.validation_uri),
                       ("resume_from.uri", ev.resume_from.uri if ev.resume_from else None)):
        if uri and uri.startswith("s3://") and not within_tenant(uri, env.tenant_id):   # never another tenant's data
            raise PoisonMessage(f"job.assigned {ev.job_id}: {field} {uri} is not under tenant {env.tenant_id!r}'s prefix",
                                reason="tenant_mismatch")
    recorded = await ctx.runs.add_assignment(uow.conn, env, ev)
    if recorded == RunStatus.CANCELLED:
        rt.log.info("assignment of a job cancelled here: not run", job_id=ev.job_id, segment_id=ev.segment_id)
        await report_unstarted_cancel(rt, uow, env, ev.job_id, ev.attempt)
        return
    if recorded == RunStatus.FINISHED:   # its attempt was fenced before it arrived: not run, nothing reported
        rt.log.warning("assignment of an attempt fenced here: not run", job_id=ev.job_id, segment_id=ev.segment_id,
                       attempt=ev.attempt)
        return
    if ctx.node.stopping:  # arrived while draining: hand it straight back to the scheduler
        if await ctx.runs.hand_back(uow.conn, ev.segment_id, ev.node_id):
            await uow.publish(JobPreemptedV1(job_id=ev.job_id, segment_id=ev.segment_id, node_id=ev.node_id,
                                             attempt=ev.attempt, reason=ctx.node.stopping, stopped_at=rt.clock(),
                                             checkpoint=ev.resume_from), tenant_id=env.tenant_id,
                              trace_id=env.trace_id)
        return
    ctx.node.wakeup.set()


async def report_unstarted_cancel(rt: AgentRuntime, uow: UnitOfWork, env: Envelope, job_id: str,
                                  attempt: int) -> None:
    """An attempt this node was given but never started ends with job.failed (user, cancelled) and no
    segment: metering then knows the attempt used nothing and closes the job's usage without waiting."""
    await uow.publish(JobFailedV1(job_id=job_id, segment_id=None, node_id=rt.ctx.config.node_id, attempt=attempt,
                                  stopped_at=rt.clock(), error_class=ErrorClass.USER, code="cancelled",
                                  message="cancelled by user before the attempt started"),
                      tenant_id=env.tenant_id, trace_id=env.trace_id)


async def on_job_cancelled(rt: AgentRuntime, uow: UnitOfWork, env: Envelope, ev: JobCancelledV1) -> None:
    """Cancel wins whatever the order the node hears things in:
    - the cancel is remembered first, so an assignment of the job arriving after it (another topic)
      is recorded as cancelled and never claimed;
    - an assignment not started yet is dropped, and reported as job.failed (cancelled) with no segment;
    - a segment already claimed is marked cancelled: before its process starts it ends without
      launching; a running process group is killed at once (SIGKILL: a cancelled job's work is worth
      nothing, so no step, emergency checkpoint or upload is spent on it). The segment reports
      job.failed (user, cancelled); nothing it wrote after the cancel is published."""
    ctx = rt.ctx
    node = ctx.config.node_id
    if ev.node_id not in (None, node):
        return
    await ctx.runs.remember_cancel(uow.conn, ev.job_id, env.tenant_id, ev.attempt)
    for attempt in await ctx.runs.cancel_assigned(uow.conn, ev.job_id, node):
        rt.log.info("assignment cancelled before start", job_id=ev.job_id, attempt=attempt)
        await report_unstarted_cancel(rt, uow, env, ev.job_id, attempt)
    if not await ctx.runs.running_count(uow.conn, ev.job_id, node) and not ctx.node.segments_of(ev.job_id):
        return
    ctx.node.cancelled.add(ev.job_id)
    for seg in ctx.node.segments_of(ev.job_id):
        seg.signal(signal.SIGKILL)
        rt.log.info("cancelling segment", job_id=ev.job_id, segment_id=seg.segment_id,
                    process_started=seg.proc is not None)


async def on_job_preempt_requested(rt: AgentRuntime, uow: UnitOfWork, env: Envelope,
                                   ev: JobPreemptRequestedV1) -> None:
    """The scheduler wants this node's GPUs back: SIGTERM the job's process group, whose recipe
    finishes the optimizer step, writes an emergency checkpoint and reports preempted (with this reason)."""
    ctx = rt.ctx
    if ev.node_id != ctx.config.node_id:
        return
    for seg in ctx.node.segments_of(ev.job_id):
        if ev.segment_id in (None, seg.segment_id):
            ctx.node.preempt_reasons[ev.job_id] = PreemptionReason(ev.reason)
            if seg.signal(signal.SIGTERM):
                rt.log.info("preempting running segment", job_id=ev.job_id, segment_id=seg.segment_id,
                            reason=ev.reason, for_job=ev.for_job_id)


async def on_node_fenced(rt: AgentRuntime, uow: UnitOfWork, env: Envelope, ev: NodeFencedV1) -> None:
    """The scheduler declared this node lost (or the segment timed out) and moved the job to a newer
    attempt: stop this attempt's segment at once (SIGKILL), report nothing more for it (no
    job.preempted/failed/completed, no checkpoint upload) and record the run as fenced. Another
    node's command, or an attempt not run here (older, newer, already ended), changes nothing."""
    ctx = rt.ctx
    if ev.node_id != ctx.config.node_id:
        return
    runs = await ctx.runs.fence(uow.conn, ev.node_id, ev.job_id, ev.attempt, ev.segment_id)
    why = f"fenced by the scheduler ({ev.reason}): attempt {ev.attempt} of the job moved on"
    for seg in ctx.node.segments_of(ev.job_id):
        if seg.run.attempt == ev.attempt and ev.segment_id in (None, seg.segment_id):
            seg.fence(why)
    starting = {t.get_name() for t in ctx.node.tasks}
    for run in runs:
        rt.log.warning("segment fenced by the scheduler; stopped without reporting", job_id=run.job_id,
                       segment_id=run.segment_id, attempt=run.attempt, reason=ev.reason)
        if f"segment-{run.segment_id}" in starting:  # claimed, its task not started: it will run nothing
            ctx.node.fenced.setdefault(run.segment_id, why)
