"""The trainer agent's background loops: heartbeats (capacity), the supervisor that starts each
claimed segment (after recovering a killed predecessor's runs), and the drain at agent stop."""

from __future__ import annotations

import asyncio
import signal
import time

from whetstone.contracts import JobPreemptedV1, NodeHeartbeatV1
from whetstone.contracts.enums import PreemptionReason

from ..adapters.processes import kill_orphan
from ..adapters.telemetry import NodeTelemetry
from ..domain.supervision import free_gpu_ids, stop_reason
from ..usecases.segments import AgentRuntime, run_segment

# --------------------------------------------------------------- heartbeats


async def heartbeat(rt: AgentRuntime) -> None:
    """Capacity and liveness every `heartbeat_s`, and at once when the node's capacity changes (a segment
    ended and freed its GPUs, or the drain began): the scheduler places only on GPU ids a node reports free,
    so a freed GPU waits for no timer and a draining node gets no new work."""
    c, node = rt.ctx.config, rt.ctx.node
    telemetry = NodeTelemetry()
    while True:
        node.capacity_changed.clear()
        segments = list(node.segments.values())
        figures = await telemetry.sample()   # outside the transaction: nvidia-smi may take a moment
        async with rt.uow() as uow:
            await uow.publish(NodeHeartbeatV1(
                node_id=c.node_id, gpu_type=c.gpu_type, gpu_count=c.gpu_count, gpu_memory_gb=c.gpu_memory_gb,
                free_gpu_ids=free_gpu_ids(c.gpu_count, [s.gpu_ids for s in segments], node.stopping is not None),
                draining=node.stopping is not None,
                spot=c.spot, interconnect_group=c.interconnect_group,
                running_jobs=sorted({s.job_id for s in segments}), sent_at=rt.clock(), address=c.address,
                gpus=figures.gpus, cpu_percent=figures.cpu_percent, rss_mb=figures.rss_mb),
                tenant_id="platform")
        try:
            await asyncio.wait_for(node.capacity_changed.wait(), timeout=c.heartbeat_s)
        except TimeoutError:
            pass


# --------------------------------------------------------------- supervisor


async def recover_interrupted(rt: AgentRuntime) -> None:
    """Runs left 'running' by an agent that was killed outright (node loss, OOM kill, SIGKILL):
    their launchers died with it (PDEATHSIG; any survivor is killed here by pid), so report them
    preempted from their last durable checkpoint: the scheduler re-queues them.

    Once per process, before any segment starts here: a restart of the supervising task (its
    database went away for a moment) finds this agent's own live segments 'running', and they
    are not a dead agent's."""
    ctx = rt.ctx
    if ctx.node.recovered:
        return
    async with rt.uow() as uow:
        runs = await ctx.runs.interrupt_running(uow.conn, ctx.config.node_id)
        for run in runs:
            if kill_orphan(run.pid, run.pid_start):
                rt.log.warning("killed a training process left by the previous agent", pid=run.pid)
            await uow.publish(JobPreemptedV1(
                job_id=run.job_id, segment_id=run.segment_id, node_id=run.node_id, attempt=run.attempt,
                reason=PreemptionReason.NODE_LOST, stopped_at=rt.clock(), checkpoint=run.durable_checkpoint),
                tenant_id=run.tenant_id, trace_id=run.trace_id)
            rt.log.warning("run interrupted by agent restart; reported preempted", job_id=run.job_id)
    ctx.node.recovered = True
    await asyncio.to_thread(ctx.workspaces.remove, [run.segment_id for run in runs])


async def supervise(rt: AgentRuntime) -> None:
    await recover_interrupted(rt)
    ctx = rt.ctx
    while True:
        if ctx.node.stopping is None:
            async with rt.uow() as uow:
                runs = await ctx.runs.claim_assigned(uow.conn, ctx.config.node_id)
            for run in runs:
                task = asyncio.create_task(run_segment(rt, run), name=f"segment-{run.segment_id}")
                ctx.node.tasks.add(task)
                task.add_done_callback(ctx.node.tasks.discard)
        ctx.node.wakeup.clear()
        try:
            await asyncio.wait_for(ctx.node.wakeup.wait(), timeout=1.0)
        except TimeoutError:
            pass


async def drain(rt: AgentRuntime) -> None:
    """Agent stop (node drain, spot reclaim): stop advertising capacity, hand back assignments
    not started yet, SIGTERM every training process group so it writes an emergency checkpoint,
    wait for the segments to upload it and report job.preempted; SIGKILL what outlives the grace."""
    ctx = rt.ctx
    reason = ctx.node.stopping = stop_reason(ctx.config.spot)
    ctx.node.capacity_changed.set()   # the next heartbeat says so now: no new work is placed here
    async with rt.uow() as uow:
        for run in await ctx.runs.hand_back_all(uow.conn, ctx.config.node_id):
            await uow.publish(JobPreemptedV1(job_id=run.job_id, segment_id=run.segment_id, node_id=run.node_id,
                                             attempt=run.attempt, reason=reason, stopped_at=rt.clock(),
                                             checkpoint=run.resume_from),
                              tenant_id=run.tenant_id, trace_id=run.trace_id)
    for seg in list(ctx.node.segments.values()):
        seg.signal(signal.SIGTERM)
    tasks = set(ctx.node.tasks)
    if not tasks:
        return
    rt.log.info("draining: waiting for emergency checkpoints", segments=len(tasks), reason=reason)
    began = time.monotonic()
    _, pending = await asyncio.wait(tasks, timeout=ctx.config.drain_timeout_s)
    rt.log.info("drained", seconds=round(time.monotonic() - began, 2), unfinished=len(pending))
    if pending:
        rt.log.error("training processes outlived the drain timeout; killing them", segments=len(pending))
        for seg in list(ctx.node.segments.values()):
            seg.signal(signal.SIGKILL)
        await asyncio.wait(pending, timeout=15)
