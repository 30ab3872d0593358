"""Metering: lifecycle events -> segments -> append-only ledger -> usage.metered (once each)."""

from __future__ import annotations

from datetime import datetime

from whetstone.contracts import Envelope, JobCompletedV1, JobFailedV1, JobPreemptedV1, JobStartedV1, UsageMeteredV1
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from .domain.billing import Anomaly, ClosedSegment, bill_segment


async def _upsert(uow: UnitOfWork, env: Envelope, job_id: str, segment_id: str, **cols) -> None:
    names = ["segment_id", "job_id", "tenant_id", *cols]
    values = [segment_id, job_id, env.tenant_id, *cols.values()]
    placeholders = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    updates = ", ".join(f"{c} = coalesce(segments.{c}, EXCLUDED.{c})" for c in cols)
    await uow.conn.execute(
        f"INSERT INTO segments ({', '.join(names)}, events) VALUES ({placeholders}, ARRAY[${len(values) + 1}])"
        f" ON CONFLICT (segment_id) DO UPDATE SET {updates}, events = segments.events || EXCLUDED.events",
        *values, str(env.event_id))


async def on_job_started(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobStartedV1) -> None:
    await _upsert(uow, env, ev.job_id, ev.segment_id, gpu_type=ev.gpu_type, gpu_count=ev.gpu_count, spot=ev.spot,
                  started_at=ev.started_at)
    await close_segment(rt, uow, ev.segment_id)


async def _stopped(rt: Runtime, uow: UnitOfWork, env: Envelope, job_id: str, segment_id: str | None,
                   stopped_at: datetime | None, kind: str, **extra) -> None:
    if segment_id is None:  # rejected before it ever ran: nothing to bill
        return
    await _upsert(uow, env, job_id, segment_id, stopped_at=stopped_at or env.occurred_at, stop_kind=kind, **extra)
    await close_segment(rt, uow, segment_id)


async def on_job_completed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobCompletedV1) -> None:
    await _stopped(rt, uow, env, ev.job_id, ev.segment_id, ev.stopped_at, "completed", terminal=True)


async def on_job_failed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobFailedV1) -> None:
    await _stopped(rt, uow, env, ev.job_id, ev.segment_id, ev.stopped_at, "failed", terminal=True,
                   error_class=ev.error_class)


async def on_job_preempted(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobPreemptedV1) -> None:
    await _stopped(rt, uow, env, ev.job_id, ev.segment_id, ev.stopped_at, "preempted",
                   checkpointed_at=ev.checkpointed_at)


async def close_segment(rt: Runtime, uow: UnitOfWork, segment_id: str) -> None:
    """Bill a segment once both ends are known; then the job total once the job is over."""
    s = await uow.conn.fetchrow("SELECT * FROM segments WHERE segment_id = $1 FOR UPDATE", segment_id)
    if s["started_at"] is None or s["stopped_at"] is None:
        return  # the other end has not arrived yet (topics are not ordered against each other)
    if await uow.conn.fetchval("SELECT 1 FROM ledger WHERE job_id = $1 AND scope = 'segment' AND segment_id = $2",
                               s["job_id"], segment_id):
        return
    seg = ClosedSegment(s["job_id"], segment_id, s["gpu_type"], s["gpu_count"], s["spot"], s["started_at"],
                        s["stopped_at"], s["stop_kind"], s["error_class"], s["checkpointed_at"])
    try:
        charge = bill_segment(seg)
    except Anomaly as exc:
        await uow.conn.execute("INSERT INTO anomalies (job_id, segment_id, reason, event_id) VALUES ($1, $2, $3, $4)",
                               s["job_id"], segment_id, str(exc), s["events"][-1])
        rt.log.warning("metering anomaly", job_id=s["job_id"], segment_id=segment_id, reason=str(exc))
        return
    await uow.conn.execute(
        "INSERT INTO ledger (job_id, tenant_id, scope, segment_id, gpu_type, gpu_count, gpu_seconds,"
        " billable_gpu_seconds, charge_class, cost, price_version, source_events)"
        " VALUES ($1,$2,'segment',$3,$4,$5,$6,$7,$8,$9,$10,$11)",
        s["job_id"], s["tenant_id"], segment_id, s["gpu_type"], s["gpu_count"], charge.gpu_seconds,
        charge.billable_gpu_seconds, charge.charge_class, charge.cost, charge.price_version, s["events"])
    await uow.publish(UsageMeteredV1(
        job_id=s["job_id"], scope="segment", segment_id=segment_id, gpu_type=s["gpu_type"], gpu_count=s["gpu_count"],
        gpu_seconds=charge.gpu_seconds, billable_gpu_seconds=charge.billable_gpu_seconds,
        charge_class=charge.charge_class, price_version=charge.price_version, cost=charge.cost),
        tenant_id=s["tenant_id"])
    await close_job(uow, s["job_id"], s["tenant_id"])


async def close_job(uow: UnitOfWork, job_id: str, tenant_id: str) -> None:
    segs = await uow.conn.fetch("SELECT segment_id, terminal FROM segments WHERE job_id = $1", job_id)
    if not any(s["terminal"] for s in segs):  # NULL until a completed/failed stop arrives
        return
    rows = await uow.conn.fetch("SELECT * FROM ledger WHERE job_id = $1 AND scope = 'segment'", job_id)
    if len(rows) < len(segs):
        return  # a segment is still open or anomalous
    inserted = await uow.conn.fetchval(
        "INSERT INTO ledger (job_id, tenant_id, scope, segment_id, gpu_type, gpu_count, gpu_seconds,"
        " billable_gpu_seconds, charge_class, cost, price_version, source_events)"
        " SELECT $1, $2, 'job', '', max(gpu_type), max(gpu_count), sum(gpu_seconds), sum(billable_gpu_seconds),"
        "  CASE WHEN bool_or(charge_class = 'review') THEN 'review' WHEN bool_and(charge_class = 'refunded')"
        "  THEN 'refunded' ELSE 'charged' END, sum(cost), max(price_version),"
        "  array(SELECT unnest(source_events) FROM ledger WHERE job_id = $1 AND scope = 'segment')"
        " FROM ledger WHERE job_id = $1 AND scope = 'segment'"
        " ON CONFLICT (job_id, scope, segment_id) DO NOTHING RETURNING *", job_id, tenant_id)
    if inserted is None:
        return
    total = await uow.conn.fetchrow("SELECT * FROM ledger WHERE job_id = $1 AND scope = 'job'", job_id)
    await uow.publish(UsageMeteredV1(
        job_id=job_id, scope="job", gpu_type=total["gpu_type"], gpu_count=total["gpu_count"],
        gpu_seconds=total["gpu_seconds"], billable_gpu_seconds=total["billable_gpu_seconds"],
        charge_class=total["charge_class"], price_version=total["price_version"], cost=float(total["cost"]),
        segments=len(rows)), tenant_id=tenant_id)
