"""Trainer agent: accept assignments for this node; a supervisor runs each segment as a child
process group (a plain process, torchrun or the deepspeed runner) and turns its JSON-lines
stdout events into Kafka events.

Guarantees: every checkpoint.written names a checkpoint whose manifest is stored; old
checkpoints are pruned only after that; every segment ends in exactly one of
job.completed / job.failed / job.preempted (a crash is a platform failure with the log
tail; a cancel a user failure; an agent stop a preemption from the last durable
checkpoint; an agent killed outright is reported preempted by its successor)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, Envelope, JobAssignedV1, JobCancelledV1, JobCompletedV1, JobFailedV1,
    JobPreemptedV1, JobPreemptRequestedV1, JobProgressV1, JobStartedV1, NodeHeartbeatV1,
)
from whetstone.runtime.checkpoints import UploadedCheckpoint
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.models import UnknownModel, resolve_model
from whetstone.runtime.s3 import parse_uri
from whetstone.runtime.service import Runtime

from .adapters.checkpoint_store import ResumePoint, S3Checkpoints
from .adapters.model_size import param_count
from .adapters.processes import kill_orphan, log_tail, signal_group, snapshot, spawn, start_ticks
from .config import TrainerAgentSettings
from .domain.checkpoints import checkpoint_prefix
from .domain.distributed import (
    DistributedConfigError, DistributedPlan, Topology, deepspeed_config, plan_distributed, requested_zero_stage,
    training_mode,
)
from .domain.launch import LaunchSpec, build_launch, parse_rendezvous
from .domain.supervision import classify_exit, failure_message, free_gpu_ids, preempt_reason, stop_reason

ERROR_CLASSES = ("user", "platform", "ambiguous")


def cfg(rt: Runtime) -> TrainerAgentSettings:
    return rt.state["config"]


def ref(value: dict[str, Any] | None) -> CheckpointRef | None:
    return CheckpointRef(**{k: value[k] for k in ("uri", "step", "manifest_sha256")}) if value else None


# ------------------------------------------------------------------ events in


async def on_job_assigned(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobAssignedV1) -> None:
    if ev.node_id != cfg(rt).node_id:
        return
    await uow.conn.execute(
        "INSERT INTO runs (segment_id, job_id, node_id, tenant_id, trace_id, attempt, gpu_ids, spec, resume_from,"
        " rendezvous, status) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,'assigned') ON CONFLICT DO NOTHING",
        ev.segment_id, ev.job_id, ev.node_id, env.tenant_id, env.trace_id, ev.attempt, ev.gpu_ids,
        ev.spec.model_dump(mode="json"), ev.resume_from.model_dump(mode="json") if ev.resume_from else None,
        ev.rendezvous)
    if rt.state["stopping"]:  # arrived while draining: hand it straight back to the scheduler
        handed_back = await uow.conn.fetchval(
            "UPDATE runs SET status = 'finished', outcome = 'preempted', finished_at = now()"
            " WHERE segment_id = $1 AND status = 'assigned' RETURNING segment_id", ev.segment_id)
        if handed_back:
            await uow.publish(JobPreemptedV1(job_id=ev.job_id, segment_id=ev.segment_id, node_id=ev.node_id,
                                             reason=rt.state["stopping"], stopped_at=rt.clock(),
                                             checkpoint=ev.resume_from), tenant_id=env.tenant_id,
                              trace_id=env.trace_id)
        return
    rt.state["wakeup"].set()


async def on_job_cancelled(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobCancelledV1) -> None:
    """Not started yet: drop the assignment. Running: SIGTERM its process group now, SIGKILL after
    `cancel_grace_s`; the segment then reports job.failed (user, cancelled) so metering closes it."""
    node = cfg(rt).node_id
    if ev.node_id not in (None, node):
        return
    dropped = await uow.conn.fetch(
        "UPDATE runs SET status = 'cancelled', finished_at = now() WHERE job_id = $1 AND node_id = $2"
        " AND status = 'assigned' RETURNING segment_id", ev.job_id, node)
    if dropped:
        rt.log.info("assignment cancelled before start", job_id=ev.job_id)
    running = await uow.conn.fetchval(
        "SELECT count(*) FROM runs WHERE job_id = $1 AND node_id = $2 AND status = 'running'", ev.job_id, node)
    if not running:
        return
    rt.state["cancelled"].add(ev.job_id)
    for seg in list(rt.state["segments"].values()):
        if seg.job_id == ev.job_id and seg.signal(signal.SIGTERM):
            asyncio.get_running_loop().call_later(cfg(rt).cancel_grace_s, seg.signal, signal.SIGKILL)
            rt.log.info("cancelling running segment", job_id=ev.job_id, segment_id=seg.segment_id)


async def on_job_preempt_requested(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobPreemptRequestedV1) -> None:
    """The scheduler wants this node's GPUs back: SIGTERM the job's process group, whose recipe
    finishes the optimizer step, writes an emergency checkpoint and reports preempted (with this reason)."""
    if ev.node_id != cfg(rt).node_id:
        return
    for seg in list(rt.state["segments"].values()):
        if seg.job_id == ev.job_id and (ev.segment_id in (None, seg.segment_id)):
            rt.state["preempt_reasons"][ev.job_id] = ev.reason
            if seg.signal(signal.SIGTERM):
                rt.log.info("preempting running segment", job_id=ev.job_id, segment_id=seg.segment_id,
                            reason=ev.reason, for_job=ev.for_job_id)


# --------------------------------------------------------------- heartbeats


async def heartbeat(rt: Runtime) -> None:
    c = cfg(rt)
    while True:
        segments = list(rt.state["segments"].values())
        async with rt.uow() as uow:
            await uow.publish(NodeHeartbeatV1(
                node_id=c.node_id, gpu_type=c.gpu_type, gpu_count=c.gpu_count, gpu_memory_gb=c.gpu_memory_gb,
                free_gpu_ids=free_gpu_ids(c.gpu_count, [s.gpu_ids for s in segments], rt.state["stopping"] is not None),
                spot=c.spot, interconnect_group=c.interconnect_group,
                running_jobs=sorted({s.job_id for s in segments}), sent_at=rt.clock(), address=c.address),
                tenant_id="platform")
        await asyncio.sleep(c.heartbeat_s)


# --------------------------------------------------------------- supervisor


async def recover_interrupted(rt: Runtime) -> None:
    """Runs left 'running' by an agent that was killed outright (node loss, OOM kill, SIGKILL):
    their launchers died with it (PDEATHSIG; any survivor is killed here by pid), so report them
    preempted from their last durable checkpoint: the scheduler re-queues them."""
    node = cfg(rt).node_id
    async with rt.uow() as uow:
        rows = await uow.conn.fetch("UPDATE runs SET status = 'interrupted', finished_at = now()"
                                    " WHERE node_id = $1 AND status = 'running' RETURNING *", node)
        for r in rows:
            if kill_orphan(r["pid"], r["pid_start"]):
                rt.log.warning("killed a training process left by the previous agent", pid=r["pid"])
            await uow.publish(JobPreemptedV1(
                job_id=r["job_id"], segment_id=r["segment_id"], node_id=node, reason="node_lost",
                stopped_at=rt.clock(), checkpoint=ref(r["latest_checkpoint"] or r["resume_from"])),
                tenant_id=r["tenant_id"], trace_id=r["trace_id"])
            rt.log.warning("run interrupted by agent restart; reported preempted", job_id=r["job_id"])
    await asyncio.to_thread(clean_stale_scratch, rt, {r["segment_id"] for r in rows})


def scratch_root(rt: Runtime) -> Path:
    c = cfg(rt)
    return (c.scratch_dir or rt.settings.data_dir / "scratch") / c.node_id


def clean_stale_scratch(rt: Runtime, segment_ids: set[str]) -> None:
    if cfg(rt).keep_scratch:
        return
    for segment_id in segment_ids:
        shutil.rmtree(scratch_root(rt) / segment_id, ignore_errors=True)


async def supervise(rt: Runtime) -> None:
    await recover_interrupted(rt)
    wakeup: asyncio.Event = rt.state["wakeup"]
    while True:
        if rt.state["stopping"] is None:
            async with rt.uow() as uow:
                rows = await uow.conn.fetch(
                    "UPDATE runs SET status = 'running', started_at = now() WHERE node_id = $1 AND status = 'assigned'"
                    " RETURNING *", cfg(rt).node_id)
            for r in rows:
                task = asyncio.create_task(run_segment(rt, dict(r)), name=f"segment-{r['segment_id']}")
                rt.state["tasks"].add(task)
                task.add_done_callback(rt.state["tasks"].discard)
        wakeup.clear()
        try:
            await asyncio.wait_for(wakeup.wait(), timeout=1.0)
        except TimeoutError:
            pass


@dataclass
class Segment:
    """One segment on this node: its process, its durable checkpoints, and its reporting."""

    rt: Runtime
    run: dict[str, Any]
    proc: asyncio.subprocess.Process | None = None
    terminal: bool = False
    last_progress: float = 0.0
    latest: CheckpointRef | None = None          # newest durable resumable checkpoint
    latest_at: datetime | None = None
    final: CheckpointRef | None = None
    final_error: str | None = None
    resumed_prefix: str | None = None            # never pruned while this segment runs
    uploaded_local: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.job_id, self.segment_id = self.run["job_id"], self.run["segment_id"]
        self.tenant_id = self.run["tenant_id"]
        self.gpu_ids: list[int] = list(self.run["gpu_ids"])
        self.latest = ref(self.run["resume_from"])

    @property
    def cancelled(self) -> bool:
        return self.job_id in self.rt.state["cancelled"]

    def signal(self, sig: int) -> bool:
        if self.proc is None or self.proc.returncode is not None:
            return False
        return signal_group(self.proc.pid, sig)

    async def publish(self, event, **columns: Any) -> None:
        """The event and the run's new state, in one transaction."""
        async with self.rt.uow() as uow:
            await uow.publish(event, tenant_id=self.tenant_id, trace_id=self.run["trace_id"])
            await self._update(uow, columns)

    async def record(self, **columns: Any) -> None:
        async with self.rt.uow() as uow:
            await self._update(uow, columns)

    async def _update(self, uow: UnitOfWork, columns: dict[str, Any]) -> None:
        if columns:
            sets = ", ".join(f"{k} = ${i}" for i, k in enumerate(columns, start=2))
            await uow.conn.execute(f"UPDATE runs SET {sets} WHERE segment_id = $1", self.segment_id, *columns.values())

    async def fail(self, error_class: str, code: str, message: str, advice: list[str] | None = None) -> None:
        self.terminal = True
        await self.publish(JobFailedV1(
            job_id=self.job_id, segment_id=self.segment_id, node_id=cfg(self.rt).node_id, stopped_at=self.rt.clock(),
            error_class=error_class if error_class in ERROR_CLASSES else "platform", code=code, message=message,
            advice=advice or []),
            status="finished", outcome="failed", finished_at=self.rt.clock())

    async def preempted(self, reason: str) -> None:
        self.terminal = True
        await self.publish(JobPreemptedV1(
            job_id=self.job_id, segment_id=self.segment_id, node_id=cfg(self.rt).node_id, reason=reason,
            stopped_at=self.rt.clock(), checkpoint=self.latest, checkpointed_at=self.latest_at),
            status="finished", outcome="preempted", finished_at=self.rt.clock())


@dataclass(frozen=True)
class Prepared:
    launch: LaunchSpec
    plan: DistributedPlan
    resume: ResumePoint
    node_rank: int


async def run_segment(rt: Runtime, run: dict[str, Any]) -> None:
    c = cfg(rt)
    seg = Segment(rt, run)
    rt.state["segments"][seg.segment_id] = seg
    scratch = scratch_root(rt) / seg.segment_id
    try:
        try:
            prepared = await asyncio.to_thread(prepare_segment, rt, run, scratch)
        except DistributedConfigError as exc:
            await seg.fail("user", "invalid_distributed_config", str(exc))
            return
        except UnknownModel as exc:
            await seg.fail("platform", "base_model_unavailable", str(exc))
            return
        except Exception as exc:
            rt.log.exception("segment setup failed", job_id=seg.job_id)
            await seg.fail("platform", "setup_failed", f"{type(exc).__name__}: {exc}")
            return
        await adopt_resume_point(rt, seg, prepared.resume)
        if seg.cancelled:
            await seg.fail("user", "cancelled", "cancelled by user")
        elif rt.state["stopping"]:
            await seg.preempted(rt.state["stopping"])
        else:
            await watch(rt, seg, prepared, scratch)
    except Exception as exc:  # the agent's own fault (database, bug): still never a silent end
        rt.log.exception("segment supervision failed", job_id=seg.job_id)
        if not seg.terminal:
            try:
                await seg.fail("platform", "agent_error", f"trainer agent error: {type(exc).__name__}: {exc}")
            except Exception:  # database unreachable: the run stays 'running' and is recovered at restart
                rt.log.exception("could not report the failure", job_id=seg.job_id)
    finally:
        rt.state["segments"].pop(seg.segment_id, None)
        if not any(s.job_id == seg.job_id for s in rt.state["segments"].values()):
            rt.state["cancelled"].discard(seg.job_id)
        if not c.keep_scratch:
            await asyncio.to_thread(shutil.rmtree, scratch, True)


async def adopt_resume_point(rt: Runtime, seg: Segment, resume: ResumePoint) -> None:
    for uri, why in resume.skipped:
        rt.log.warning("checkpoint not usable; falling back to an older one", job_id=seg.job_id, uri=uri, why=why)
    if seg.run["resume_from"] and resume.path is None:
        rt.log.error("no durable checkpoint verifies; training restarts from step 0", job_id=seg.job_id)
    seg.latest = ref(resume.ref())
    seg.resumed_prefix = parse_uri(resume.uri)[1] if resume.uri else None
    await seg.record(latest_checkpoint=resume.ref())


def prepare_segment(rt: Runtime, run: dict[str, Any], scratch: Path) -> Prepared:
    """Check the model pin, decide the distributed plan (rejecting impossible ones before any
    download), fetch data and the checkpoint to resume from, write the recipe config and launch."""
    c, spec = cfg(rt), run["spec"]
    scratch.mkdir(parents=True, exist_ok=True)
    model = resolve_model(spec["base_model"], rt.settings.model_catalog)
    if model.sha256 != spec["base_model_sha256"]:
        raise UnknownModel(f"base model {spec['base_model']} on this node has sha256 {model.sha256[:12]}…, "
                           f"job pinned {spec['base_model_sha256'][:12]}…")
    hyper = spec.get("hyperparameters") or {}
    rendezvous = parse_rendezvous(run.get("rendezvous"), run["segment_id"])
    gpu_node = c.gpu_type != "cpu"
    topology = Topology(nodes=rendezvous.nodes if rendezvous else 1, gpus_per_node=max(len(run["gpu_ids"]), 1),
                        gpu_node=gpu_node, gpu_memory_gb=c.gpu_memory_gb)
    plan = plan_distributed(training_mode(spec["method"], hyper), param_count(model.location), topology,
                            requested_zero_stage(hyper))
    train = rt.store.download_file(spec["train_uri"], scratch / "data" / "train.jsonl")
    val = rt.store.download_file(spec["validation_uri"], scratch / "data" / "validation.jsonl") \
        if spec.get("validation_uri") else None
    resume = S3Checkpoints(rt.store).resume_point(run["tenant_id"], run["job_id"], run["resume_from"],
                                                  scratch / "resume")
    ds_config = deepspeed_config(plan)
    ds_path = scratch / "deepspeed.json"
    if ds_config:
        ds_path.write_text(json.dumps(ds_config, indent=1))
    config = {
        "job_id": run["job_id"], "base_model": model.location, "train_file": str(train),
        "validation_file": str(val) if val else None, "output_dir": str(scratch / "out"),
        "method": spec["method"], "hyperparameters": hyper,
        "resume_from": str(resume.path) if resume.path else None,
        "deepspeed": str(ds_path) if ds_config else None, "zero_init": plan.zero_init,
        "distributed": {"world_size": plan.world_size, "zero_stage": plan.zero_stage, "reasons": list(plan.reasons)},
    }
    config_path = scratch / "config.json"
    config_path.write_text(json.dumps(config, indent=1))
    launch = build_launch(
        python=sys.executable, module=c.recipe_module, config_path=str(config_path), plan=plan,
        gpu_ids=run["gpu_ids"], gpu_node=gpu_node, key=run["segment_id"], rendezvous=rendezvous,
        launcher=c.launcher, shutdown_timeout_s=int(c.drain_timeout_s), hostfile_path=str(scratch / "hostfile"),
        extra_env={"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"})
    if launch.hostfile:
        (scratch / "hostfile").write_text(launch.hostfile)
    return Prepared(launch, plan, resume, rendezvous.node_rank if rendezvous else 0)


async def watch(rt: Runtime, seg: Segment, prepared: Prepared, scratch: Path) -> None:
    """Run the launcher, handle its events in order, and make sure its end is reported."""
    c = cfg(rt)
    log_path = scratch / "train.log"
    started_at = rt.clock()
    proc = seg.proc = await spawn(prepared.launch.argv, prepared.launch.environment(os.environ), log_path)
    await seg.record(pid=proc.pid, pid_start=start_ticks(proc.pid))
    if seg.cancelled:  # the cancel arrived while the process was being started
        seg.signal(signal.SIGTERM)
        asyncio.get_running_loop().call_later(c.cancel_grace_s, seg.signal, signal.SIGKILL)
    rt.log.info("training process started", job_id=seg.job_id, segment_id=seg.segment_id, pid=proc.pid,
                launcher=prepared.launch.launcher, zero_stage=prepared.plan.zero_stage)
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    reader = asyncio.create_task(read_events(proc, events))
    try:
        while (msg := await events.get()) is not None:
            await on_child_event(rt, seg, msg, started_at, scratch)
        if seg.terminal:
            try:
                await asyncio.wait_for(proc.wait(), timeout=c.exit_grace_s)
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


async def read_events(proc: asyncio.subprocess.Process, events: asyncio.Queue) -> None:
    """Keep the pipe drained while events are handled (uploads take time): one JSON object per line."""
    assert proc.stdout is not None
    try:
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:  # a line over the limit: not an event
                continue
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                events.put_nowait(msg)
    finally:
        events.put_nowait(None)


async def report_exit(rt: Runtime, seg: Segment, code: int, prepared: Prepared, log_path: Path) -> None:
    report = classify_exit(code, cancelled=seg.cancelled, stopping=rt.state["stopping"],
                           worker_node=prepared.node_rank > 0, log_tail=log_tail(log_path))
    if report.outcome == "failed":
        rt.log.error("training process ended without a result", job_id=seg.job_id, code=code, reported=report.code)
        await seg.fail(report.error_class or "platform", report.code or "trainer_crashed", report.message or "")
    elif report.outcome == "preempted":
        await seg.preempted(report.reason or "signal")
    else:
        seg.terminal = True
        await seg.record(status="finished", outcome="worker_done", finished_at=rt.clock())


async def on_child_event(rt: Runtime, seg: Segment, msg: dict[str, Any], started_at: datetime, scratch: Path) -> None:
    c, run = cfg(rt), seg.run
    kind = msg.get("event")
    if kind == "started":
        await seg.publish(JobStartedV1(
            job_id=seg.job_id, node_id=c.node_id, segment_id=seg.segment_id, attempt=run["attempt"],
            gpu_type=c.gpu_type, gpu_count=max(1, len(seg.gpu_ids)), spot=c.spot, started_at=started_at,
            total_steps=msg.get("total_steps"), resumed_from_step=msg.get("resumed_from_step")))
    elif kind == "progress":
        now = time.monotonic()
        if now - seg.last_progress < c.progress_interval_s and msg.get("step") != msg.get("total_steps"):
            return  # throttled
        seg.last_progress = now
        fields = {k: msg.get(k) for k in ("step", "total_steps", "epoch", "loss", "grad_norm", "learning_rate",
                                          "tokens_per_s", "samples_per_s", "peak_memory_mb", "validation_loss",
                                          "tokens_seen", "token_accuracy", "gpu_utilization")}
        await seg.publish(JobProgressV1(job_id=seg.job_id, segment_id=seg.segment_id, **fields))
    elif kind == "checkpoint":
        await on_checkpoint(rt, seg, msg, scratch)
    elif kind == "completed":
        seg.terminal = True
        if seg.final is None:
            await seg.fail("platform", "no_final_checkpoint",
                           seg.final_error or "training finished without a durable final checkpoint")
            return
        await seg.publish(JobCompletedV1(
            job_id=seg.job_id, segment_id=seg.segment_id, node_id=c.node_id, stopped_at=rt.clock(),
            steps=int(msg.get("step", 0)), train_loss=msg.get("train_loss"), tokens=msg.get("tokens"),
            final_checkpoint=seg.final, metrics={k: v for k, v in msg.items() if k not in ("event", "job_id", "time")
                                                 and isinstance(v, (int, float, str, bool))}),
            status="finished", outcome="completed", finished_at=rt.clock())
    elif kind == "preempted":
        if seg.cancelled:
            await seg.fail("user", "cancelled", "cancelled by user")
            return
        rt.log.info("training process stopped for preemption", job_id=seg.job_id, step=msg.get("step"),
                    sigterm_to_checkpoint_s=msg.get("sigterm_to_checkpoint_s"))
        requested = rt.state["preempt_reasons"].pop(seg.job_id, None)
        await seg.preempted(requested or preempt_reason(rt.state["stopping"], msg.get("reason")))
    elif kind == "failed":
        advice = [str(a) for a in msg.get("advice") or []] if isinstance(msg.get("advice"), list) else []
        await seg.fail(str(msg.get("error_class", "platform")), str(msg.get("code") or "training_failed"),
                       failure_message(msg.get("message"), advice), advice)
    elif kind == "oom_retry":
        rt.log.warning("training ran out of memory; the recipe retries with a smaller micro-batch",
                       job_id=seg.job_id, attempt=msg.get("attempt"), micro_batch_size=msg.get("micro_batch_size"))


async def on_checkpoint(rt: Runtime, seg: Segment, msg: dict[str, Any], scratch: Path) -> None:
    """Upload (files, then the manifest), publish checkpoint.written, and only then prune older
    checkpoints in S3 and on local disk. A cancelled job's checkpoints are not kept."""
    c = cfg(rt)
    try:
        step, kind, local = int(msg["step"]), str(msg["kind"]), Path(msg["path"])
        prefix = checkpoint_prefix(seg.tenant_id, seg.job_id, step, kind)
    except (KeyError, TypeError, ValueError) as exc:
        rt.log.error("malformed checkpoint event", job_id=seg.job_id, error=str(exc))
        return
    if seg.cancelled:
        rt.log.info("job cancelled: checkpoint not uploaded", job_id=seg.job_id, step=step)
        return
    store = S3Checkpoints(rt.store)
    staged = scratch / "uploading" / f"step-{step}-{kind}"
    meta = {"job_id": seg.job_id, "segment_id": seg.segment_id, "tenant_id": seg.tenant_id, "step": step,
            "kind": kind}
    try:
        up = await upload_with_retries(rt, store, local, staged, prefix, meta)
    except Exception as exc:
        rt.log.error("checkpoint not uploaded", job_id=seg.job_id, step=step, kind=kind,
                     error=f"{type(exc).__name__}: {exc}")
        if kind == "final":
            seg.final_error = f"final checkpoint upload failed: {type(exc).__name__}: {exc}"
        return
    finally:
        await asyncio.to_thread(shutil.rmtree, staged, True)
    now = rt.clock()
    checkpoint = CheckpointRef(uri=up.uri, step=step, manifest_sha256=up.manifest_sha256)
    columns: dict[str, Any] = {}
    if kind == "final":
        seg.final = checkpoint
    else:
        seg.latest, seg.latest_at = checkpoint, now
        columns["latest_checkpoint"] = checkpoint.model_dump()
    await seg.publish(CheckpointWrittenV1(
        job_id=seg.job_id, segment_id=seg.segment_id, checkpoint_id=f"{seg.job_id}:{step}:{kind}", kind=kind,
        step=step, uri=up.uri, manifest_sha256=up.manifest_sha256, files=up.files, size_bytes=up.size_bytes,
        written_at=now, metrics={k: float(msg[k]) for k in ("validation_loss",) if isinstance(msg.get(k), (int, float))}),
        **columns)
    if kind != "final":
        await prune(rt, seg, prefix, local)


async def upload_with_retries(rt: Runtime, store: S3Checkpoints, local: Path, staged: Path, prefix: str,
                              meta: dict[str, Any]) -> UploadedCheckpoint:
    attempts = cfg(rt).upload_attempts
    for attempt in range(1, attempts + 1):
        try:
            await asyncio.to_thread(snapshot, local, staged)
            return await asyncio.to_thread(store.upload, staged, prefix, meta)
        except Exception as exc:  # S3 hiccup (boto3 retried already), or the directory vanished
            if attempt == attempts:
                raise
            rt.log.warning("checkpoint upload failed; retrying", prefix=prefix, attempt=attempt,
                           error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.5 * 2 ** attempt)
    raise AssertionError("unreachable")


async def prune(rt: Runtime, seg: Segment, newest: str, local: Path) -> None:
    protected = {newest} | ({seg.resumed_prefix} if seg.resumed_prefix else set())
    try:
        deleted = await asyncio.to_thread(S3Checkpoints(rt.store).prune, seg.tenant_id, seg.job_id,
                                          cfg(rt).keep_checkpoints, protected)
    except Exception as exc:  # pruning is housekeeping: a failure costs storage, never a job
        rt.log.warning("checkpoint pruning failed", job_id=seg.job_id, error=f"{type(exc).__name__}: {exc}")
        deleted = []
    if deleted:
        rt.log.info("old checkpoints pruned", job_id=seg.job_id, deleted=deleted)
    for old in seg.uploaded_local:  # uploaded and superseded: free the node's disk
        await asyncio.to_thread(shutil.rmtree, old, True)
    seg.uploaded_local = [local]


# --------------------------------------------------------------------- stop


async def drain(rt: Runtime) -> None:
    """Agent stop (node drain, spot reclaim): stop advertising capacity, hand back assignments
    not started yet, SIGTERM every training process group so it writes an emergency checkpoint,
    wait for the segments to upload it and report job.preempted; SIGKILL what outlives the grace."""
    c = cfg(rt)
    reason = rt.state["stopping"] = stop_reason(c.spot)
    async with rt.uow() as uow:
        rows = await uow.conn.fetch(
            "UPDATE runs SET status = 'finished', outcome = 'preempted', finished_at = now()"
            " WHERE node_id = $1 AND status = 'assigned' RETURNING *", c.node_id)
        for r in rows:
            await uow.publish(JobPreemptedV1(job_id=r["job_id"], segment_id=r["segment_id"], node_id=c.node_id,
                                             reason=reason, stopped_at=rt.clock(), checkpoint=ref(r["resume_from"])),
                              tenant_id=r["tenant_id"], trace_id=r["trace_id"])
    for seg in list(rt.state["segments"].values()):
        seg.signal(signal.SIGTERM)
    tasks = set(rt.state["tasks"])
    if not tasks:
        return
    rt.log.info("draining: waiting for emergency checkpoints", segments=len(tasks), reason=reason)
    began = time.monotonic()
    _, pending = await asyncio.wait(tasks, timeout=c.drain_timeout_s)
    rt.log.info("drained", seconds=round(time.monotonic() - began, 2), unfinished=len(pending))
    if pending:
        rt.log.error("training processes outlived the drain timeout; killing them", segments=len(pending))
        for seg in list(rt.state["segments"].values()):
            seg.signal(signal.SIGKILL)
        await asyncio.wait(pending, timeout=15)
