"""Running one segment: the child process group, its JSON-lines events turned into Kafka events,
checkpoints uploaded (manifest last) and pruned, and exactly one terminal event per segment
(none for a fenced one)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from whetstone.contracts import (
    CheckpointRef,
    CheckpointWrittenV1,
    Event,
    JobCompletedV1,
    JobFailedV1,
    JobPreemptedV1,
    JobProgressV1,
    JobStartedV1,
    ModelMergedV1,
)
from whetstone.contracts.enums import CheckpointKind, ErrorClass, PreemptionReason
from whetstone.runtime.checkpoints import CorruptCheckpoint, ManifestMeta
from whetstone.runtime.environment import image_digest
from whetstone.runtime.models import UnknownModel
from whetstone.runtime.service import Runtime

from ..adapters.checkpoint_store import ResumePoint
from ..adapters.processes import log_tail, port_in_use, signal_group, spawn, start_ticks
from ..adapters.workspace import Prepared
from ..context import TrainerAgentContext
from ..domain.checkpoints import StaleAttempt, checkpoint_prefix
from ..domain.child_env import child_environment
from ..domain.distributed import DistributedConfigError
from ..domain.launch import gang_devices, gang_nodes, port_taken_message, rendezvous_port
from ..domain.recipe_io import (
    TERMINAL,
    Checkpoint,
    ChildEvent,
    Completed,
    Failed,
    Merged,
    OomRetry,
    Preempted,
    Progress,
    Started,
    parse_event,
)
from ..domain.runs import Run, RunOutcome, RunStatus, RunUpdate, image_pin_problem
from ..domain.supervision import (
    ProgressCadence,
    classify_exit,
    gang_peer_lost,
    job_progress,
    preempt_reason,
)
from . import merges

CANCEL_VOIDS = (JobProgressV1, CheckpointWrittenV1, JobCompletedV1)   # never published for a cancelled job

AgentRuntime = Runtime[TrainerAgentContext]


@dataclass
class Segment:
    """One segment on this node: its process, its durable checkpoints, and its reporting."""

    rt: AgentRuntime
    run: Run
    proc: asyncio.subprocess.Process | None = None
    terminal: bool = False
    cadence: ProgressCadence | None = None       # which progress records are reported (set at the first)
    latest: CheckpointRef | None = None          # newest durable resumable checkpoint
    latest_at: datetime | None = None
    final: CheckpointRef | None = None
    final_error: str | None = None
    fenced: str | None = None                    # why a newer attempt of the job took over
    started: bool = False                        # its job.started was published (metering bills from it)
    resumed_prefix: str | None = None            # never pruned while this segment runs
    uploaded_local: list[Path] = field(default_factory=list)
    outcome: list[ModelMergedV1] = field(default_factory=list)  # published with job.completed (a merge job's)

    def __post_init__(self) -> None:
        self.job_id, self.segment_id, self.tenant_id = self.run.job_id, self.run.segment_id, self.run.tenant_id
        self.gpu_ids: list[int] = list(self.run.gpu_ids)
        self.latest = self.run.resume_from

    @property
    def cancelled(self) -> bool:
        return self.job_id in self.rt.ctx.node.cancelled

    @property
    def fenced_by_scheduler(self) -> bool:
        """A node.fenced command named this segment: nothing more is reported or uploaded for it."""
        return self.segment_id in self.rt.ctx.node.fenced

    def fence(self, why: str) -> None:
        self.rt.ctx.node.fenced[self.segment_id] = self.fenced = why
        self.terminal = True
        self.signal(signal.SIGKILL)

    def signal(self, sig: int) -> bool:
        if self.proc is None or self.proc.returncode is not None:
            return False
        return signal_group(self.proc.pid, sig)

    async def publish(self, event: Event, *also: Event, change: RunUpdate | None = None) -> None:
        """The event (and `also`) and the run's new state, in one transaction (nothing once the segment
        is fenced; no progress, checkpoint or completion once its job is cancelled)."""
        if self.fenced_by_scheduler:
            self.rt.log.info("segment fenced: event not published", job_id=self.job_id, event_type=event.EVENT_TYPE)
            return
        if self.cancelled and isinstance(event, CANCEL_VOIDS):
            self.rt.log.info("job cancelled: event not published", job_id=self.job_id, event_type=event.EVENT_TYPE)
            return
        async with self.rt.uow() as uow:
            for ev in (event, *also):
                await uow.publish(ev, tenant_id=self.tenant_id, trace_id=self.run.trace_id)
            if change is not None:
                await self.rt.ctx.runs.update(uow.conn, self.segment_id, self.run.node_id, change)

    async def record(self, change: RunUpdate) -> None:
        async with self.rt.uow() as uow:
            await self.rt.ctx.runs.update(uow.conn, self.segment_id, self.run.node_id, change)

    def finished(self, outcome: RunOutcome) -> RunUpdate:
        return RunUpdate(status=RunStatus.FINISHED, outcome=outcome, finished_at=self.rt.clock())

    async def fail(self, error_class: ErrorClass, code: str, message: str, advice: list[str] | None = None) -> None:
        self.terminal = True
        await self.publish(JobFailedV1(
            job_id=self.job_id, segment_id=self.segment_id, node_id=self.run.node_id, attempt=self.run.attempt,
            stopped_at=self.rt.clock(), error_class=error_class, code=code, message=message, advice=advice or []),
            *merges.failed(self.run, code, message), change=self.finished(RunOutcome.FAILED))

    async def end_cancelled(self) -> None:
        """The job was cancelled: job.failed (user, cancelled). A segment whose job.started was never
        published names its attempt but no segment: it ran nothing billable, and metering must not
        wait for a start that never comes."""
        self.terminal = True
        await self.publish(JobFailedV1(
            job_id=self.job_id, segment_id=self.segment_id if self.started else None, node_id=self.run.node_id,
            attempt=self.run.attempt, stopped_at=self.rt.clock(), error_class=ErrorClass.USER, code="cancelled",
            message="cancelled by user"), *merges.failed(self.run, "cancelled", "cancelled by user"),
            change=self.finished(RunOutcome.CANCELLED))

    async def preempted(self, reason: PreemptionReason) -> None:
        self.terminal = True
        await self.publish(JobPreemptedV1(
            job_id=self.job_id, segment_id=self.segment_id, node_id=self.run.node_id, attempt=self.run.attempt,
            reason=reason,
            stopped_at=self.rt.clock(), checkpoint=self.latest, checkpointed_at=self.latest_at),
            change=self.finished(RunOutcome.PREEMPTED))

    async def adopt(self, resume: ResumePoint) -> None:
        """Resume from what verified (maybe an older checkpoint than asked, maybe none)."""
        for uri, why in resume.skipped:
            self.rt.log.warning("checkpoint not usable; falling back to an older one", job_id=self.job_id, uri=uri,
                                why=why)
        if self.run.resume_from and resume.path is None:
            self.rt.log.error("no durable checkpoint verifies; training restarts from step 0", job_id=self.job_id)
        self.latest = resume.ref()
        self.resumed_prefix = resume.prefix
        await self.record(RunUpdate(latest_checkpoint=self.latest))


async def run_segment(rt: AgentRuntime, run: Run) -> None:
    ctx = rt.ctx
    seg = Segment(rt, run)
    ctx.node.segments[seg.segment_id] = seg
    try:
        if seg.fenced_by_scheduler:  # fenced between its claim and now
            return
        if seg.cancelled:            # cancelled between its claim and now: nothing is prepared or launched
            await seg.end_cancelled()
            return
        if problem := image_pin_problem(run.spec.image, image_digest()):   # before anything is downloaded
            await seg.fail(ErrorClass.PLATFORM, "image_mismatch", problem)
            return
        try:
            if run.is_merge:
                prepared = await asyncio.to_thread(merges.prepare_merge, ctx.workspaces, run)
            else:
                prepared = await asyncio.to_thread(ctx.workspaces.prepare, run)
        except CorruptCheckpoint as exc:  # a merge job's adapter does not verify against its pinned manifest
            await seg.fail(ErrorClass.PLATFORM, "adapter_corrupted", str(exc))
            return
        except DistributedConfigError as exc:
            await seg.fail(ErrorClass.USER, "invalid_distributed_config", str(exc))
            return
        except UnknownModel as exc:
            await seg.fail(ErrorClass.PLATFORM, "base_model_unavailable", str(exc))
            return
        except StaleAttempt as exc:
            await seg.fail(ErrorClass.PLATFORM, "stale_attempt", str(exc))
            return
        except Exception as exc:
            rt.log.exception("segment setup failed", job_id=seg.job_id)
            await seg.fail(ErrorClass.PLATFORM, "setup_failed", f"{type(exc).__name__}: {exc}")
            return
        await seg.adopt(prepared.resume)
        port = rendezvous_port(prepared.launch, prepared.node_rank)
        if seg.fenced_by_scheduler:
            rt.log.info("segment fenced before its process started", job_id=seg.job_id)
        elif seg.cancelled:
            await seg.end_cancelled()
        elif ctx.node.stopping:
            await seg.preempted(ctx.node.stopping)
        elif port is not None and await asyncio.to_thread(port_in_use, port):   # the gang's peers are fenced
            await seg.fail(ErrorClass.PLATFORM, "rendezvous_port_in_use", port_taken_message(ctx.config.node_id, port))
        else:
            await watch(rt, seg, prepared, ctx.workspaces.path(seg.segment_id))
    except Exception as exc:  # the agent's own fault (database, bug): still never a silent end
        rt.log.exception("segment supervision failed", job_id=seg.job_id)
        if not seg.terminal and not seg.fenced_by_scheduler:
            try:
                await seg.fail(ErrorClass.PLATFORM, "agent_error", f"trainer agent error: {type(exc).__name__}: {exc}")
            except Exception:  # database unreachable: the run stays 'running' and is recovered at restart
                rt.log.exception("could not report the failure", job_id=seg.job_id)
    finally:
        ctx.node.segments.pop(seg.segment_id, None)
        ctx.node.fenced.pop(seg.segment_id, None)
        ctx.node.capacity_changed.set()   # its GPUs are free: the next heartbeat tells the scheduler now
        if not ctx.node.segments_of(seg.job_id):
            ctx.node.cancelled.discard(seg.job_id)
        await asyncio.to_thread(ctx.workspaces.remove, [seg.segment_id])


async def watch(rt: AgentRuntime, seg: Segment, prepared: Prepared, scratch: Path) -> None:
    """Run the launcher, handle its events in order, and make sure its end is reported."""
    c = rt.ctx.config
    log_path = scratch / "train.log"
    started_at = rt.clock()
    # the child sees an allow-listed environment: none of the agent's credentials (domain/child_env.py)
    proc = seg.proc = await spawn(prepared.launch.argv, prepared.launch.environment(child_environment(os.environ)),
                                  log_path)
    await seg.record(RunUpdate(pid=proc.pid, pid_start=start_ticks(proc.pid)))
    if seg.fenced_by_scheduler:  # the fence arrived while the process was being started
        seg.signal(signal.SIGKILL)
    elif seg.cancelled:  # the cancel arrived while the process was being started
        seg.signal(signal.SIGKILL)
    rt.log.info("training process started", job_id=seg.job_id, segment_id=seg.segment_id, pid=proc.pid,
                launcher=prepared.launch.launcher, zero_stage=prepared.plan.zero_stage)
    events: asyncio.Queue[ChildEvent | None] = asyncio.Queue()
    reader = asyncio.create_task(read_events(proc, events))
    # after a stop or failure has been reported, the launcher gets `exit_grace_s` to exit (its stdout may stay
    # open: rank 0's torchrun waits at its exit barrier for a stopped or lost node's launcher, 300 s by
    # default), then it is killed: its GPUs are free for the next segment, which the scheduler places only
    # on GPUs the node's heartbeat reports free. A completed segment's launcher is waited for.
    loop, deadline = asyncio.get_running_loop(), None
    try:
        while True:
            try:
                event = await asyncio.wait_for(events.get(), None if deadline is None else deadline - loop.time())
            except TimeoutError:
                break
            if event is None:
                break
            await on_child_event(rt, seg, event, started_at, scratch)
            if seg.terminal and deadline is None and not isinstance(event, Completed):
                deadline = loop.time() + c.exit_grace_s
        if seg.terminal:
            try:
                await asyncio.wait_for(proc.wait(), timeout=c.exit_grace_s if deadline is None
                                       else max(deadline - loop.time(), 0.0))
            except TimeoutError:
                rt.log.warning("training process lingers after its last event; killing it", job_id=seg.job_id)
        else:
            code = await proc.wait()
            await report_exit(rt, seg, code, prepared, log_path)
    finally:
        reader.cancel()
        if proc.returncode is None:  # only while it lives: its pid (= group id) is surely still ours
            signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()


async def read_events(proc: asyncio.subprocess.Process, events: asyncio.Queue[ChildEvent | None]) -> None:
    """Keep the pipe drained while events are handled (uploads take time): one event per line, parsed
    once; a line that is not an event is skipped."""
    assert proc.stdout is not None
    try:
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:  # a line over the limit: not an event
                continue
            if not line:
                break
            event = parse_event(line)
            if event is not None:
                events.put_nowait(event)
    finally:
        events.put_nowait(None)


async def report_exit(rt: AgentRuntime, seg: Segment, code: int, prepared: Prepared, log_path: Path) -> None:
    if seg.fenced_by_scheduler:
        rt.log.warning("fenced segment stopped; nothing reported", job_id=seg.job_id, segment_id=seg.segment_id,
                       code=code)
        return
    if seg.cancelled:
        await seg.end_cancelled()
        return
    requested = rt.ctx.node.preempt_reasons.pop(seg.job_id, None)   # a preempt request reached this node
    report = classify_exit(code, cancelled=seg.cancelled, stopping=rt.ctx.node.stopping,
                           worker_node=prepared.node_rank > 0, log_tail=log_tail(log_path),
                           stop_requested=requested is not None)
    if seg.fenced:
        await seg.fail(ErrorClass.PLATFORM, "stale_attempt", seg.fenced)
    elif report.outcome == RunOutcome.FAILED and gang_peer_lost(gang_nodes(seg.run.rendezvous), report.error_class,
                                                                report.message or ""):
        rt.log.error("a node of the gang was lost: segment preempted (node_lost)", job_id=seg.job_id, code=code)
        await seg.preempted(PreemptionReason.NODE_LOST)
    elif report.outcome == RunOutcome.FAILED:
        rt.log.error("training process ended without a result", job_id=seg.job_id, code=code, reported=report.code)
        await seg.fail(report.error_class or ErrorClass.PLATFORM, report.code or "trainer_crashed", report.message or "")
    elif report.outcome == RunOutcome.PREEMPTED:
        await seg.preempted(report.reason or PreemptionReason.SIGNAL)
    else:
        if requested is not None or rt.ctx.node.stopping:
            rt.log.info("gang rank stopped on request; rank 0 reports the gang's emergency checkpoint",
                        job_id=seg.job_id, segment_id=seg.segment_id, code=code)
        seg.terminal = True
        await seg.record(seg.finished(RunOutcome.WORKER_DONE))


async def on_child_event(rt: AgentRuntime, seg: Segment, event: ChildEvent, started_at: datetime,
                         scratch: Path) -> None:
    c, node = rt.ctx.config, rt.ctx.node
    if seg.fenced_by_scheduler:  # what the killed process had already written: not ours to report
        return
    if seg.cancelled and not seg.terminal and isinstance(event, TERMINAL):
        await seg.end_cancelled()   # whatever the process says last, the job's outcome is the cancel
        return
    match event:
        case Started():             # published even when cancelled meanwhile: the time it ran is billed
            seg.started = True
            await seg.publish(JobStartedV1(
                job_id=seg.job_id, node_id=c.node_id, segment_id=seg.segment_id, attempt=seg.run.attempt,
                gpu_type=c.gpu_type, gpu_count=gang_devices(seg.run.rendezvous, len(seg.gpu_ids)), spot=c.spot,
                started_at=started_at,
                total_steps=event.total_steps, resumed_from_step=event.resumed_from_step))
        case Progress():
            seg.cadence = seg.cadence or ProgressCadence(c.progress_interval_s)
            if seg.cadence.due(event):
                await seg.publish(job_progress(event, job_id=seg.job_id, segment_id=seg.segment_id,
                                               attempt=seg.run.attempt))
        case Checkpoint():
            await on_checkpoint(rt, seg, event, scratch)
        case Completed():
            seg.terminal = True
            if seg.final is None:
                await seg.fail(ErrorClass.PLATFORM, "no_final_checkpoint",
                               seg.final_error or "training finished without a durable final checkpoint")
                return
            await seg.publish(JobCompletedV1(
                job_id=seg.job_id, segment_id=seg.segment_id, node_id=c.node_id, attempt=seg.run.attempt,
                stopped_at=rt.clock(), steps=event.step, train_loss=event.train_loss, tokens=event.tokens,
                final_checkpoint=seg.final, metrics=event.metrics()), *seg.outcome,
                change=seg.finished(RunOutcome.COMPLETED))
        case Merged():
            await merges.on_merged(rt, seg, event, scratch)
        case Preempted():
            rt.log.info("training process stopped for preemption", job_id=seg.job_id, step=event.step,
                        sigterm_to_checkpoint_s=event.sigterm_to_checkpoint_s)
            requested = node.preempt_reasons.pop(seg.job_id, None)
            await seg.preempted(requested or preempt_reason(node.stopping, event.reason))
        case Failed() if gang_peer_lost(gang_nodes(seg.run.rendezvous), event.error_class, event.full_message()):
            rt.log.error("a node of the gang was lost or stopped answering: segment preempted (node_lost)",
                         job_id=seg.job_id, error=event.full_message()[-500:])
            await seg.preempted(PreemptionReason.NODE_LOST)
        case Failed():
            await seg.fail(event.error_class, event.code, event.full_message(), event.advice)
        case OomRetry():
            rt.log.warning("training ran out of memory; the recipe retries with a smaller micro-batch",
                           job_id=seg.job_id, attempt=event.attempt, micro_batch_size=event.micro_batch_size)


async def on_checkpoint(rt: AgentRuntime, seg: Segment, event: Checkpoint, scratch: Path) -> None:
    """Upload (files, then the manifest), publish checkpoint.written, and only then prune older
    checkpoints in S3 and on local disk. A cancelled job's checkpoints are not kept."""
    ctx = rt.ctx
    step, kind, local = event.step, event.kind, event.path
    prefix = checkpoint_prefix(seg.tenant_id, seg.job_id, step, kind, seg.run.attempt)
    if seg.cancelled or seg.fenced_by_scheduler:
        rt.log.info("job cancelled or segment fenced: checkpoint not uploaded", job_id=seg.job_id, step=step)
        return
    staged = scratch / "uploading" / f"step-{step}-{kind}"
    meta: ManifestMeta = {"job_id": seg.job_id, "segment_id": seg.segment_id, "tenant_id": seg.tenant_id, "step": step,
            "kind": kind, "attempt": seg.run.attempt}

    def on_retry(attempt: int, exc: Exception) -> None:
        rt.log.warning("checkpoint upload failed; retrying", prefix=prefix, attempt=attempt,
                       error=f"{type(exc).__name__}: {exc}")
    try:
        up = await asyncio.to_thread(ctx.checkpoints.upload_snapshot, local, staged, prefix, meta,
                                     fence=seg.run.fence, attempts=ctx.config.upload_attempts, on_retry=on_retry,
                                     outage_budget_s=ctx.config.final_upload_outage_s
                                     if kind == CheckpointKind.FINAL else 0.0)
    except StaleAttempt as exc:  # this node lost its job (partitioned, declared lost): stop, write nothing
        rt.log.error("a newer attempt of the job took over; stopping this segment", job_id=seg.job_id, error=str(exc))
        seg.fenced = seg.final_error = str(exc)
        seg.signal(signal.SIGKILL)
        return
    except Exception as exc:
        rt.log.error("checkpoint not uploaded", job_id=seg.job_id, step=step, kind=kind,
                     error=f"{type(exc).__name__}: {exc}")
        if kind == CheckpointKind.FINAL:
            seg.final_error = f"final checkpoint upload failed: {type(exc).__name__}: {exc}"
        return
    finally:
        await asyncio.to_thread(shutil.rmtree, staged, True)
    now = rt.clock()
    checkpoint = CheckpointRef(uri=up.uri, step=step, manifest_sha256=up.manifest_sha256)
    change = None
    if kind == CheckpointKind.FINAL:
        seg.final = checkpoint
    else:
        seg.latest, seg.latest_at = checkpoint, now
        change = RunUpdate(latest_checkpoint=checkpoint)
    await seg.publish(CheckpointWrittenV1(
        job_id=seg.job_id, segment_id=seg.segment_id, attempt=seg.run.attempt,
        checkpoint_id=f"{seg.job_id}:{step}:{kind}", kind=kind,
        step=step, uri=up.uri, manifest_sha256=up.manifest_sha256, files=up.files, size_bytes=up.size_bytes,
        written_at=now, metrics=event.metrics()), change=change)
    if kind != CheckpointKind.FINAL:
        await prune(rt, seg, prefix, local)


async def prune(rt: AgentRuntime, seg: Segment, newest: str, local: Path) -> None:
    protected = {newest} | ({seg.resumed_prefix} if seg.resumed_prefix else set())
    try:
        deleted = await asyncio.to_thread(rt.ctx.checkpoints.prune, seg.tenant_id, seg.job_id,
                                          rt.ctx.config.keep_checkpoints, protected, seg.run.fence)
    except Exception as exc:  # pruning is housekeeping: a failure costs storage, never a job
        rt.log.warning("checkpoint pruning failed", job_id=seg.job_id, error=f"{type(exc).__name__}: {exc}")
        deleted = []
    if deleted:
        rt.log.info("old checkpoints pruned", job_id=seg.job_id, deleted=deleted)
    for old in seg.uploaded_local:  # uploaded and superseded: free the node's disk
        await asyncio.to_thread(shutil.rmtree, old, True)
    seg.uploaded_local = [local]
