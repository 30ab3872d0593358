"""Scheduler handlers: parse -> domain -> unit of work (state + outbox)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, DatasetValidatedV1, Envelope, EvalCompletedV1, JobAssignedV1,
    JobCancelledV1, JobCompletedV1, JobFailedV1, JobPreemptedV1, JobProgressV1, JobQueuedV1, JobRequestedV1,
    JobStartedV1, NodeHeartbeatV1, Resources, TrainingSpec, UsageMeteredV1, job_id_for,
)
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.models import UnknownModel, resolve_model
from whetstone.runtime.service import PoisonMessage, Runtime

from .domain import jobs as J
from .domain.placement import NodeSnapshot, alive, place


class IdempotencyConflict(Exception):
    pass


class Rejected(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


async def log_job_event(uow: UnitOfWork, job_id: str, now: datetime, message: str, level: str = "info",
                        **data: Any) -> None:
    await uow.conn.execute(
        "INSERT INTO job_events (job_id, created_at, level, message, data) VALUES ($1, $2, $3, $4, $5)",
        job_id, now, level, message, data)


async def get_job(uow: UnitOfWork, job_id: str, *, lock: bool = False) -> dict | None:
    row = await uow.conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1" + (" FOR UPDATE" if lock else ""), job_id)
    return dict(row) if row else None


async def set_status(rt: Runtime, uow: UnitOfWork, job: dict, target: str, message: str, **fields: Any) -> bool:
    """Apply a state-machine transition; False (and nothing changed) when it is not allowed."""
    if not J.can_transition(job["status"], target):
        rt.log.info("transition ignored", job_id=job["job_id"], current=job["status"], target=target)
        return False
    now = rt.clock()
    sets = {"status": target, "updated_at": now, **fields}
    if target in J.TERMINAL:
        sets.setdefault("finished_at", now)
    cols = ", ".join(f"{k} = ${i}" for i, k in enumerate(sets, start=2))
    await uow.conn.execute(f"UPDATE jobs SET {cols} WHERE job_id = $1", job["job_id"], *sets.values())
    job.update(sets)
    await log_job_event(uow, job["job_id"], now, message, status=target)
    return True


async def fail_job(rt: Runtime, uow: UnitOfWork, job: dict, code: str, message: str, error_class: str = "user") -> None:
    if await set_status(rt, uow, job, J.FAILED, message, node_id=None, gpu_ids=[],
                        error={"code": code, "message": message, "error_class": error_class}):
        await uow.publish(JobFailedV1(job_id=job["job_id"], error_class=error_class, code=code, message=message),
                          tenant_id=job["tenant_id"])


# --------------------------------------------------------------- admission


async def submit_job(rt: Runtime, uow: UnitOfWork, tenant_id: str, req: JobRequestedV1) -> tuple[dict, bool]:
    """Create (or return the existing) job for this tenant's idempotency key."""
    tier = J.check_tenant(tenant_id, rt.settings.tenants, req.tier)
    if isinstance(tier, J.Rejection):
        raise Rejected(tier.code, tier.message, 403)
    if req.job_id != job_id_for(tenant_id, req.idempotency_key):
        raise Rejected("bad_job_id", "job_id must be job_id_for(tenant_id, idempotency_key)")
    request = req.model_dump(mode="json", exclude={"job_id"})
    fingerprint = J.request_fingerprint(request)
    now = rt.clock()
    inserted = await uow.conn.fetchval(
        "INSERT INTO jobs (job_id, tenant_id, idempotency_key, fingerprint, request, status, tier, priority,"
        " created_at, updated_at) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$9) ON CONFLICT DO NOTHING RETURNING 1",
        req.job_id, tenant_id, req.idempotency_key, fingerprint, request, J.VALIDATING, tier,
        J.TIER_PRIORITY[tier], now)
    job = await get_job(uow, req.job_id, lock=True)
    assert job is not None
    if not inserted:
        if job["tenant_id"] != tenant_id or job["fingerprint"] != fingerprint:
            raise IdempotencyConflict(
                f"idempotency_key {req.idempotency_key!r} was already used for job {job['job_id']} "
                "with different parameters")
        return job, False
    await log_job_event(uow, job["job_id"], now, "job created", model=req.model, training_file=req.training_file)
    try:
        model = await asyncio.to_thread(resolve_model, req.model, rt.settings.model_catalog)
    except UnknownModel as exc:
        await fail_job(rt, uow, job, "unknown_base_model", str(exc))
        return job, True
    await uow.conn.execute("UPDATE jobs SET spec = $2 WHERE job_id = $1", job["job_id"],
                           {"base_model": model.ref, "base_model_sha256": model.sha256})
    job["spec"] = {"base_model": model.ref, "base_model_sha256": model.sha256}
    await try_queue(rt, uow, job)
    return job, True


async def try_queue(rt: Runtime, uow: UnitOfWork, job: dict) -> None:
    """Move a job out of validating_files once its dataset's verdict is known."""
    if job["status"] != J.VALIDATING:
        return
    req = job["request"]
    ds = await uow.conn.fetchrow("SELECT * FROM datasets WHERE tenant_id = $1 AND dataset_id = $2",
                                 job["tenant_id"], req["training_file"])
    if ds is None:
        return  # waits for dataset.validated
    if ds["status"] != "accepted":
        reasons = "; ".join(f"line {e.get('line')}: {e['message']}" if e.get("line") else e["message"]
                            for e in ds["errors"][:5])
        await fail_job(rt, uow, job, "invalid_training_file", f"dataset {ds['dataset_id']} was rejected: {reasons}")
        return
    mismatch = J.check_method_fits_dataset(req["method"], ds["purpose"])
    if mismatch:
        await fail_job(rt, uow, job, mismatch.code, mismatch.message)
        return
    hp, hp_hash = J.resolve_hyperparameters(req["method"], req.get("hyperparameters") or {})
    spec = TrainingSpec(
        base_model=job["spec"]["base_model"], base_model_sha256=job["spec"]["base_model_sha256"],
        dataset_id=ds["dataset_id"], dataset_version=ds["version"], train_uri=ds["train_uri"],
        validation_uri=ds["validation_uri"], method=req["method"], hyperparameters=hp, hyperparameters_hash=hp_hash)
    resources = Resources(gpu_type=rt.state["config"].default_gpu_type, gpus_per_node=1, nodes=1)
    now = rt.clock()
    await set_status(rt, uow, job, J.QUEUED, "job queued", spec=spec.model_dump(mode="json"),
                     resources=resources.model_dump(mode="json"), queued_at=now)
    position = await uow.conn.fetchval(
        "SELECT count(*) FROM jobs WHERE status = 'queued' AND (priority, queued_at) <= ($1, $2)",
        job["priority"], now)
    await uow.publish(JobQueuedV1(job_id=job["job_id"], tier=job["tier"], spec=spec, resources=resources,
                                  queue_position=position, cost_estimate=ds["cost_estimate"]),
                      tenant_id=job["tenant_id"])
    await dispatch(rt, uow)


async def on_job_requested(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobRequestedV1) -> None:
    try:
        await submit_job(rt, uow, env.tenant_id, ev)
    except Rejected as exc:
        await uow.publish(JobFailedV1(job_id=ev.job_id, error_class="user", code=exc.code, message=exc.message),
                          tenant_id=env.tenant_id)
    except IdempotencyConflict as exc:
        raise PoisonMessage(str(exc)) from exc


async def on_dataset_validated(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: DatasetValidatedV1) -> None:
    await uow.conn.execute(
        "INSERT INTO datasets (tenant_id, dataset_id, version, status, purpose, train_uri, validation_uri,"
        " rows_kept, tokens_total, errors, cost_estimate) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)"
        " ON CONFLICT (tenant_id, dataset_id) DO UPDATE SET version = EXCLUDED.version, status = EXCLUDED.status,"
        " purpose = EXCLUDED.purpose, train_uri = EXCLUDED.train_uri, validation_uri = EXCLUDED.validation_uri,"
        " rows_kept = EXCLUDED.rows_kept, tokens_total = EXCLUDED.tokens_total, errors = EXCLUDED.errors,"
        " cost_estimate = EXCLUDED.cost_estimate",
        env.tenant_id, ev.dataset_id, ev.version, ev.status, ev.purpose, ev.train_uri, ev.validation_uri,
        ev.rows_kept, ev.tokens_total, [e.model_dump(mode="json") for e in ev.errors], ev.cost_estimate)
    waiting = await uow.conn.fetch(
        "SELECT job_id FROM jobs WHERE tenant_id = $1 AND status = $2 AND request->>'training_file' = $3"
        " ORDER BY created_at FOR UPDATE", env.tenant_id, J.VALIDATING, ev.dataset_id)
    for row in waiting:
        job = await get_job(uow, row["job_id"])
        assert job is not None
        await try_queue(rt, uow, job)


# ---------------------------------------------------------------- placement


async def node_snapshots(uow: UnitOfWork) -> list[NodeSnapshot]:
    rows = await uow.conn.fetch(
        "SELECT n.*, coalesce((SELECT array_agg(g) FROM jobs j, unnest(j.gpu_ids) g"
        "  WHERE j.node_id = n.node_id AND j.status = ANY($1::text[])), '{}') AS busy FROM nodes n WHERE NOT lost",
        list(J.ACTIVE_ON_NODE))
    return [NodeSnapshot(r["node_id"], r["gpu_type"], tuple(range(r["gpu_count"])), frozenset(r["busy"]),
                         r["last_seen"], r["spot"], r["interconnect_group"]) for r in rows]


async def dispatch(rt: Runtime, uow: UnitOfWork) -> int:
    """One scheduling cycle: heads of the queue in priority/FIFO order onto live nodes."""
    cfg = rt.state["config"]
    await uow.conn.execute("SELECT pg_advisory_xact_lock(42)")  # one cycle at a time across replicas
    nodes = alive(await node_snapshots(uow), rt.clock(), cfg.node_timeout)
    queued = await uow.conn.fetch(
        "SELECT job_id FROM jobs WHERE status = 'queued' ORDER BY priority, queued_at, job_id LIMIT 200")
    placed = 0
    for row in queued:
        job = await get_job(uow, row["job_id"], lock=True)
        if job is None or job["status"] != J.QUEUED:
            continue
        res = Resources.model_validate(job["resources"])
        where = place(res.gpu_type, res.gpus_per_node, nodes)
        if where is None:
            continue
        attempt = job["attempt"] + 1
        segment_id = f"{job['job_id']}-s{attempt}"
        await set_status(rt, uow, job, J.PROVISIONING, f"assigned to node {where.node_id}",
                         node_id=where.node_id, gpu_ids=list(where.gpu_ids), attempt=attempt, segment_id=segment_id)
        ckpt = job["latest_checkpoint"]
        await uow.publish(JobAssignedV1(
            job_id=job["job_id"], node_id=where.node_id, segment_id=segment_id, attempt=attempt,
            gpu_ids=list(where.gpu_ids), spec=TrainingSpec.model_validate(job["spec"]),
            resume_from=CheckpointRef(**{k: ckpt[k] for k in ("uri", "step", "manifest_sha256")}) if ckpt else None,
        ), tenant_id=job["tenant_id"])
        nodes = [NodeSnapshot(n.node_id, n.gpu_type, n.gpu_ids, n.busy_gpu_ids | set(where.gpu_ids), n.last_seen,
                              n.spot, n.interconnect_group) if n.node_id == where.node_id else n for n in nodes]
        placed += 1
    return placed


async def on_node_heartbeat(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: NodeHeartbeatV1) -> None:
    await uow.conn.execute(
        "INSERT INTO nodes (node_id, gpu_type, gpu_count, spot, interconnect_group, last_seen, lost)"
        " VALUES ($1,$2,$3,$4,$5,$6,false) ON CONFLICT (node_id) DO UPDATE SET gpu_type = EXCLUDED.gpu_type,"
        " gpu_count = EXCLUDED.gpu_count, spot = EXCLUDED.spot, interconnect_group = EXCLUDED.interconnect_group,"
        " last_seen = greatest(nodes.last_seen, EXCLUDED.last_seen), lost = false",
        ev.node_id, ev.gpu_type, ev.gpu_count, ev.spot, ev.interconnect_group, ev.sent_at)
    if await uow.conn.fetchval("SELECT 1 FROM jobs WHERE status = 'queued' LIMIT 1"):
        await dispatch(rt, uow)


# -------------------------------------------------------------- lifecycle


async def _current(rt: Runtime, uow: UnitOfWork, job_id: str, segment_id: str | None) -> dict | None:
    """The job, if this event belongs to its current segment (stale segments are ignored)."""
    job = await get_job(uow, job_id, lock=True)
    if job is None:
        rt.log.warning("event for unknown job", job_id=job_id)
        return None
    if segment_id is not None and job["segment_id"] != segment_id:
        rt.log.info("event of an old segment ignored", job_id=job_id, segment_id=segment_id)
        return None
    return job


async def on_job_started(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobStartedV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job:
        await set_status(rt, uow, job, J.RUNNING, f"training started on {ev.node_id}"
                         + (f", resumed from step {ev.resumed_from_step}" if ev.resumed_from_step else ""),
                         started_at=job["started_at"] or ev.started_at,
                         progress={**job["progress"], "total_steps": ev.total_steps})


async def on_job_progress(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobProgressV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job and job["status"] in (J.PROVISIONING, J.RUNNING, J.CHECKPOINTING) and \
            ev.step >= job["progress"].get("step", -1):
        progress = {k: v for k, v in ev.model_dump().items() if k not in ("job_id", "segment_id") and v is not None}
        await uow.conn.execute("UPDATE jobs SET progress = $2, updated_at = $3 WHERE job_id = $1",
                               ev.job_id, progress, rt.clock())
        if job["status"] == J.PROVISIONING:
            await set_status(rt, uow, job, J.RUNNING, "training running")


async def on_checkpoint_written(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: CheckpointWrittenV1) -> None:
    job = await get_job(uow, ev.job_id, lock=True)
    if job is None:
        return
    latest = job["latest_checkpoint"] or {}
    if ev.step >= latest.get("step", -1):
        await uow.conn.execute(
            "UPDATE jobs SET latest_checkpoint = $2 WHERE job_id = $1", ev.job_id,
            {"uri": ev.uri, "step": ev.step, "manifest_sha256": ev.manifest_sha256, "kind": ev.kind})
    await log_job_event(uow, ev.job_id, rt.clock(), f"{ev.kind} checkpoint at step {ev.step}", uri=ev.uri)


async def on_job_preempted(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobPreemptedV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job is None:
        return
    if ev.checkpoint:
        latest = job["latest_checkpoint"] or {}
        if ev.checkpoint.step >= latest.get("step", -1):
            job["latest_checkpoint"] = {**ev.checkpoint.model_dump(), "kind": "emergency"}
    if await set_status(rt, uow, job, J.PREEMPTED, f"preempted ({ev.reason})",
                        latest_checkpoint=job["latest_checkpoint"], node_id=None, gpu_ids=[]):
        await requeue(rt, uow, job)


async def requeue(rt: Runtime, uow: UnitOfWork, job: dict) -> None:
    """A preempted job always goes back to the queue, same job_id, priority kept."""
    await set_status(rt, uow, job, J.QUEUED, "re-queued; resumes from its latest checkpoint", queued_at=job["queued_at"])
    await uow.publish(JobQueuedV1(job_id=job["job_id"], tier=job["tier"], spec=TrainingSpec.model_validate(job["spec"]),
                                  resources=Resources.model_validate(job["resources"]), requeued=True),
                      tenant_id=job["tenant_id"])
    await dispatch(rt, uow)


async def on_job_completed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobCompletedV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job:
        await set_status(rt, uow, job, J.EVALUATING, f"training finished after {ev.steps} steps; evaluating",
                         trained_tokens=ev.tokens, node_id=None, gpu_ids=[],
                         latest_checkpoint={**ev.final_checkpoint.model_dump(), "kind": "final"})
        await dispatch(rt, uow)


async def on_job_failed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobFailedV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job and job["status"] not in J.TERMINAL:
        await set_status(rt, uow, job, J.FAILED, ev.message, node_id=None, gpu_ids=[],
                         error={"code": ev.code, "message": ev.message, "error_class": ev.error_class})
        await dispatch(rt, uow)


async def on_eval_completed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: EvalCompletedV1) -> None:
    job = await get_job(uow, ev.job_id, lock=True)
    if job:
        await set_status(rt, uow, job, J.SUCCEEDED, f"evaluation {ev.verdict}: {'; '.join(ev.reasons)}",
                         eval=ev.model_dump(mode="json"))


# ------------------------------------------------------------ commands


async def cancel_job(rt: Runtime, uow: UnitOfWork, job: dict) -> bool:
    node = job["node_id"]
    if not await set_status(rt, uow, job, J.CANCELLED, "cancelled by user", node_id=None, gpu_ids=[]):
        return False
    await uow.publish(JobCancelledV1(job_id=job["job_id"], node_id=node), tenant_id=job["tenant_id"])
    return True


async def watch_lost_nodes(rt: Runtime) -> None:
    """Nodes silent past the timeout are lost: their jobs are preempted and re-queued."""
    cfg = rt.state["config"]
    while True:
        await asyncio.sleep(cfg.lost_node_check_s)
        async with rt.uow() as uow:
            cutoff = rt.clock() - cfg.node_timeout
            lost = await uow.conn.fetch(
                "UPDATE nodes SET lost = true WHERE NOT lost AND last_seen < $1 RETURNING node_id", cutoff)
            for node in lost:
                rows = await uow.conn.fetch("SELECT job_id FROM jobs WHERE node_id = $1 AND status = ANY($2::text[])",
                                            node["node_id"], list(J.ACTIVE_ON_NODE))
                for r in rows:
                    job = await get_job(uow, r["job_id"], lock=True)
                    ckpt = job["latest_checkpoint"]
                    await uow.publish(JobPreemptedV1(
                        job_id=job["job_id"], segment_id=job["segment_id"], node_id=node["node_id"],
                        reason="node_lost", stopped_at=rt.clock(),
                        checkpoint=CheckpointRef(**{k: ckpt[k] for k in ("uri", "step", "manifest_sha256")})
                        if ckpt else None), tenant_id=job["tenant_id"])
                rt.log.warning("node lost", node_id=node["node_id"], jobs=[r["job_id"] for r in rows])



async def on_usage_metered(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: UsageMeteredV1) -> None:
    """Quota accounting arrives as events, never by reading metering's tables."""
    if ev.scope != "job":
        return
    month = env.occurred_at.strftime("%Y-%m")
    await uow.conn.execute(
        "INSERT INTO tenant_usage (tenant_id, month, jobs, gpu_seconds, cost) VALUES ($1, $2, 1, $3, $4)"
        " ON CONFLICT (tenant_id, month) DO UPDATE SET jobs = tenant_usage.jobs + 1,"
        " gpu_seconds = tenant_usage.gpu_seconds + EXCLUDED.gpu_seconds, cost = tenant_usage.cost + EXCLUDED.cost",
        env.tenant_id, month, ev.billable_gpu_seconds, ev.cost)


async def expire_waiting_jobs(rt: Runtime) -> None:
    """A job whose training file never gets validated fails with a clear reason instead of hanging."""
    cfg = rt.state["config"]
    while True:
        await asyncio.sleep(min(5.0, cfg.dataset_wait_s / 2))
        async with rt.uow() as uow:
            rows = await uow.conn.fetch(
                "SELECT job_id FROM jobs WHERE status = $1 AND created_at < $2 FOR UPDATE SKIP LOCKED",
                J.VALIDATING, rt.clock() - timedelta(seconds=cfg.dataset_wait_s))
            for r in rows:
                job = await get_job(uow, r["job_id"])
                await fail_job(rt, uow, job, "training_file_not_found",
                               f"training_file {job['request']['training_file']!r} was not validated within "
                               f"{cfg.dataset_wait_s:.0f}s: upload it first (whet datasets upload) and use the "
                               "dataset id it prints")
