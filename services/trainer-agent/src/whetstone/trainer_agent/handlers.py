"""Trainer agent: accept assignments for this node; a supervisor runs each segment
in its own child process group and turns its stdout events into Kafka events."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, Envelope, JobAssignedV1, JobCancelledV1, JobCompletedV1, JobFailedV1,
    JobPreemptedV1, JobProgressV1, JobStartedV1, NodeHeartbeatV1,
)
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.models import UnknownModel, resolve_model
from whetstone.runtime.service import Runtime

from whetstone.runtime.checkpoints import CorruptCheckpoint, download_checkpoint, upload_checkpoint
from .config import TrainerAgentSettings


def cfg(rt: Runtime) -> TrainerAgentSettings:
    return rt.state["config"]


# ------------------------------------------------------------------ events in


async def on_job_assigned(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobAssignedV1) -> None:
    if ev.node_id != cfg(rt).node_id:
        return
    await uow.conn.execute(
        "INSERT INTO runs (segment_id, job_id, node_id, tenant_id, trace_id, attempt, gpu_ids, spec, resume_from,"
        " status) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,'assigned') ON CONFLICT DO NOTHING",
        ev.segment_id, ev.job_id, ev.node_id, env.tenant_id, env.trace_id, ev.attempt, ev.gpu_ids,
        ev.spec.model_dump(mode="json"), ev.resume_from.model_dump(mode="json") if ev.resume_from else None)
    rt.state["wakeup"].set()


async def on_job_cancelled(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobCancelledV1) -> None:
    rows = await uow.conn.fetch(
        "UPDATE runs SET status = 'cancelled', finished_at = now() WHERE job_id = $1 AND node_id = $2"
        " AND status = 'assigned' RETURNING segment_id", ev.job_id, cfg(rt).node_id)
    for proc_job, proc in list(rt.state["procs"].items()):
        if proc_job == ev.job_id and proc.returncode is None:
            rt.state["cancelled"].add(ev.job_id)
            os.killpg(proc.pid, signal.SIGTERM)
    if rows:
        rt.log.info("assignment cancelled before start", job_id=ev.job_id)


# --------------------------------------------------------------- heartbeats


async def heartbeat(rt: Runtime) -> None:
    c = cfg(rt)
    while True:
        busy = {g for run in rt.state["running_gpus"].values() for g in run}
        async with rt.uow() as uow:
            await uow.publish(NodeHeartbeatV1(
                node_id=c.node_id, gpu_type=c.gpu_type, gpu_count=c.gpu_count, gpu_memory_gb=c.gpu_memory_gb,
                free_gpu_ids=[g for g in range(c.gpu_count) if g not in busy], spot=c.spot,
                interconnect_group=c.interconnect_group, running_jobs=sorted(rt.state["procs"]),
                sent_at=rt.clock()), tenant_id="platform")
        await asyncio.sleep(c.heartbeat_s)


# --------------------------------------------------------------- supervisor


async def recover_interrupted(rt: Runtime) -> None:
    """Runs left 'running' by a previous agent process died with it (PDEATHSIG):
    report them preempted from their last durable checkpoint so they are re-queued."""
    async with rt.uow() as uow:
        rows = await uow.conn.fetch("UPDATE runs SET status = 'interrupted', finished_at = now()"
                                    " WHERE node_id = $1 AND status = 'running' RETURNING *", cfg(rt).node_id)
        for r in rows:
            ck = r["latest_checkpoint"] or r["resume_from"]
            await uow.publish(JobPreemptedV1(
                job_id=r["job_id"], segment_id=r["segment_id"], node_id=cfg(rt).node_id, reason="node_lost",
                stopped_at=rt.clock(), checkpoint=CheckpointRef(**{k: ck[k] for k in ("uri", "step", "manifest_sha256")})
                if ck else None), tenant_id=r["tenant_id"], trace_id=r["trace_id"])
            rt.log.warning("run interrupted by agent restart; reported preempted", job_id=r["job_id"])


async def supervise(rt: Runtime) -> None:
    await recover_interrupted(rt)
    wakeup: asyncio.Event = rt.state["wakeup"]
    while True:
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


class Segment:
    """Publishes one segment's events, all tagged with its tenant and trace."""

    def __init__(self, rt: Runtime, run: dict[str, Any]) -> None:
        self.rt, self.run = rt, run
        self.job_id, self.segment_id = run["job_id"], run["segment_id"]
        self.terminal = False
        self.last_progress = 0.0
        self.latest: CheckpointRef | None = (CheckpointRef(**{k: run["resume_from"][k] for k in
                                                              ("uri", "step", "manifest_sha256")})
                                             if run["resume_from"] else None)
        self.latest_at: datetime | None = None

    async def publish(self, event, **extra_sql: Any) -> None:
        async with self.rt.uow() as uow:
            await uow.publish(event, tenant_id=self.run["tenant_id"], trace_id=self.run["trace_id"])
            if extra_sql:
                cols = ", ".join(f"{k} = ${i}" for i, k in enumerate(extra_sql, start=2))
                await uow.conn.execute(f"UPDATE runs SET {cols} WHERE segment_id = $1", self.segment_id,
                                       *extra_sql.values())

    async def fail(self, error_class: str, code: str, message: str) -> None:
        self.terminal = True
        await self.publish(JobFailedV1(job_id=self.job_id, segment_id=self.segment_id, node_id=cfg(self.rt).node_id,
                                       stopped_at=self.rt.clock(), error_class=error_class, code=code,
                                       message=message), status="finished", outcome="failed", finished_at=self.rt.clock())


async def run_segment(rt: Runtime, run: dict[str, Any]) -> None:
    c = cfg(rt)
    seg = Segment(rt, run)
    scratch = (c.scratch_dir or rt.settings.data_dir / "scratch") / c.node_id / run["segment_id"]
    try:
        config = await asyncio.to_thread(prepare_scratch, rt, run, scratch)
    except (UnknownModel, CorruptCheckpoint) as exc:
        await seg.fail("platform", "setup_failed", str(exc))
        return
    except Exception as exc:
        await seg.fail("platform", "setup_failed", f"{type(exc).__name__}: {exc}")
        return
    started_at = rt.clock()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "CUDA_VISIBLE_DEVICES": ",".join(map(str, run["gpu_ids"])) if c.gpu_type != "cpu" else ""}
    stderr_path = scratch / "train.log"
    with open(stderr_path, "wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "whetstone.trainer_agent.recipes.sft", "--config", str(scratch / "config.json"),
            stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env, start_new_session=True, limit=1 << 22)
    rt.state["procs"][run["job_id"]] = proc
    rt.state["running_gpus"][run["segment_id"]] = run["gpu_ids"]
    rt.log.info("training process started", job_id=run["job_id"], pid=proc.pid, segment_id=run["segment_id"])
    try:
        assert proc.stdout is not None
        async for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            await on_child_event(rt, seg, msg, started_at, scratch)
        code = await proc.wait()
        if not seg.terminal:
            if run["job_id"] in rt.state["cancelled"]:
                await seg.fail("user", "cancelled", "cancelled by user")
            else:
                tail = stderr_path.read_text(errors="replace")[-1500:]
                await seg.fail("platform", "trainer_crashed",
                               f"training process exited with code {code} without a result; log tail: {tail}")
    finally:
        rt.state["procs"].pop(run["job_id"], None)
        rt.state["running_gpus"].pop(run["segment_id"], None)
        rt.state["cancelled"].discard(run["job_id"])
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if not c.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def prepare_scratch(rt: Runtime, run: dict[str, Any], scratch: Path) -> Path:
    """Download data (and the checkpoint to resume from), verify the base model pin, write the recipe config."""
    spec = run["spec"]
    scratch.mkdir(parents=True, exist_ok=True)
    model = resolve_model(spec["base_model"], rt.settings.model_catalog)
    if model.sha256 != spec["base_model_sha256"]:
        raise UnknownModel(f"base model {spec['base_model']} on this node has sha256 {model.sha256[:12]}…, "
                           f"job pinned {spec['base_model_sha256'][:12]}…")
    train = rt.store.download_file(spec["train_uri"], scratch / "data" / "train.jsonl")
    val = rt.store.download_file(spec["validation_uri"], scratch / "data" / "validation.jsonl") \
        if spec.get("validation_uri") else None
    resume = None
    if run["resume_from"]:
        resume = scratch / "resume"
        download_checkpoint(rt.store, run["resume_from"]["uri"], resume, run["resume_from"]["manifest_sha256"])
    config = {
        "job_id": run["job_id"], "base_model": model.location, "train_file": str(train),
        "validation_file": str(val) if val else None, "output_dir": str(scratch / "out"),
        "method": spec["method"], "hyperparameters": spec["hyperparameters"],
        "resume_from": str(resume) if resume else None,
    }
    path = scratch / "config.json"
    path.write_text(json.dumps(config, indent=1))
    return path


async def on_child_event(rt: Runtime, seg: Segment, msg: dict[str, Any], started_at: datetime, scratch: Path) -> None:
    c, run = cfg(rt), seg.run
    kind = msg.get("event")
    if kind == "started":
        await seg.publish(JobStartedV1(
            job_id=seg.job_id, node_id=c.node_id, segment_id=seg.segment_id, attempt=run["attempt"],
            gpu_type=c.gpu_type, gpu_count=max(1, len(run["gpu_ids"])), spot=c.spot, started_at=started_at,
            total_steps=msg.get("total_steps"), resumed_from_step=msg.get("resumed_from_step")))
    elif kind == "progress":
        now = time.monotonic()
        if now - seg.last_progress < c.progress_interval_s and msg.get("step") != msg.get("total_steps"):
            return  # throttled
        seg.last_progress = now
        fields = {k: msg.get(k) for k in ("step", "total_steps", "epoch", "loss", "grad_norm", "learning_rate",
                                          "tokens_per_s", "samples_per_s", "peak_memory_mb")}
        await seg.publish(JobProgressV1(job_id=seg.job_id, segment_id=seg.segment_id, **fields))
    elif kind == "checkpoint":
        step, ck_kind = int(msg["step"]), msg["kind"]
        prefix = f"tenants/{run['tenant_id']}/jobs/{seg.job_id}/checkpoints/step-{step:08d}-{ck_kind}"
        up = await asyncio.to_thread(upload_checkpoint, rt.store, Path(msg["path"]), prefix,
                                     {"job_id": seg.job_id, "segment_id": seg.segment_id, "step": step, "kind": ck_kind})
        seg.latest = CheckpointRef(uri=up.uri, step=step, manifest_sha256=up.manifest_sha256)
        seg.latest_at = rt.clock()
        await seg.publish(CheckpointWrittenV1(
            job_id=seg.job_id, segment_id=seg.segment_id, checkpoint_id=f"{seg.job_id}:{step}:{ck_kind}", kind=ck_kind,
            step=step, uri=up.uri, manifest_sha256=up.manifest_sha256, files=up.files, size_bytes=up.size_bytes,
            written_at=seg.latest_at), latest_checkpoint=seg.latest.model_dump())
    elif kind == "completed":
        seg.terminal = True
        if seg.latest is None:
            await seg.fail("platform", "no_final_checkpoint", "training finished without a final checkpoint")
            return
        await seg.publish(JobCompletedV1(
            job_id=seg.job_id, segment_id=seg.segment_id, node_id=c.node_id, stopped_at=rt.clock(),
            steps=int(msg.get("step", 0)), train_loss=msg.get("train_loss"), tokens=msg.get("tokens"),
            final_checkpoint=seg.latest), status="finished", outcome="completed", finished_at=rt.clock())
    elif kind == "preempted":
        seg.terminal = True
        if seg.job_id in rt.state["cancelled"]:
            await seg.fail("user", "cancelled", "cancelled by user")
            return
        await seg.publish(JobPreemptedV1(
            job_id=seg.job_id, segment_id=seg.segment_id, node_id=c.node_id, reason=msg.get("reason", "signal"),
            stopped_at=rt.clock(), checkpoint=seg.latest, checkpointed_at=seg.latest_at),
            status="finished", outcome="preempted", finished_at=rt.clock())
    elif kind == "failed":
        await seg.fail(msg.get("error_class", "platform"), msg.get("code", "training_failed"),
                       msg.get("message", "training failed"))


async def drain(rt: Runtime, timeout_s: float = 60.0) -> None:
    """Agent shutdown (node drain): SIGTERM every training process so it writes an
    emergency checkpoint, and wait for their segments to report preempted."""
    for proc in list(rt.state["procs"].values()):
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGTERM)
    if rt.state["tasks"]:
        await asyncio.wait(list(rt.state["tasks"]), timeout=timeout_s)
