"""Usage API.

Tenants (a verified caller with `read`): a job's ledger (`total` once the job is over, the
current line of each segment, every append-only entry), the events behind any line (audit), a
month's usage. Operators (scope `admin`): open anomalies, jobs held for review, review decisions.
Another tenant's job or line answers 404, never its data.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Literal

from datetime import UTC, datetime

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from whetstone.runtime.errors import ApiError
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.service import Runtime

from .handlers import review_job


def _entry(r) -> dict:
    return {"id": r["id"], "scope": r["scope"], "segment_id": r["segment_id"] or None, "entry": r["entry"],
            "revision": r["revision"], "gpu_type": r["gpu_type"], "gpu_count": r["gpu_count"], "spot": r["spot"],
            "tier": r["tier"], "gpu_seconds": float(r["gpu_seconds"]),
            "billable_gpu_seconds": float(r["billable_gpu_seconds"]),
            "rate_per_gpu_hour": float(r["rate"]), "cost": float(r["cost"]), "list_cost": float(r["list_cost"]),
            "charge_class": r["charge_class"], "price_version": r["price_version"], "period": r["period"],
            "basis": r["basis"], "currency": "USD", "source_events": list(r["source_events"]),
            "usage_event_id": r["usage_event_id"], "created_at": r["created_at"].isoformat()}


def job_class_of(classes: set[str], fallback: str) -> str:
    if "review" in classes:
        return "review"
    if classes == {"refunded"}:
        return "refunded"
    return "charged" if classes else fallback


def _total(job_row, segment_rows: list) -> dict:
    """The job's net: the sum of its segments' entries (its total line plus any later correction)."""
    current = _current_lines(segment_rows)
    return {"gpu_seconds": float(sum((r["gpu_seconds"] for r in segment_rows), Decimal(0))),
            "billable_gpu_seconds": float(sum((r["billable_gpu_seconds"] for r in segment_rows), Decimal(0))),
            "cost": float(sum((r["cost"] for r in segment_rows), Decimal(0))),
            "list_cost": float(sum((r["list_cost"] for r in segment_rows), Decimal(0))),
            "charge_class": job_class_of({r["charge_class"] for r in current}, job_row["charge_class"]),
            "currency": "USD", "segments": len(current), "outcome": job_row["outcome"],
            "price_version": job_row["price_version"], "closed_at": job_row["created_at"].isoformat(),
            "total_line_id": job_row["id"],
            "corrected_after_close": any(r["id"] > job_row["id"] for r in segment_rows)}


def _current_lines(segment_rows: list) -> list:
    """Each segment's latest charge, unless it was reversed since (then it has none)."""
    latest: dict[str, object] = {}
    for r in segment_rows:  # in id order
        latest[r["segment_id"]] = r if r["entry"] == "charge" else None
    return [r for r in latest.values() if r is not None]


class ReviewDecision(BaseModel):
    decision: Literal["charge", "refund"]
    note: str = Field(default="", max_length=2000)


def operator_only(caller: Caller) -> None:
    """Anomalies and reviews span tenants (and a review decides a charge): the platform's operator only."""
    if not caller.operator:
        raise ApiError(403, "Only the platform's operator may use this route.", type="permission_error",
                       code="operator_only")


def routes(rt: Runtime) -> APIRouter:
    r = APIRouter(prefix="/v1/usage")

    @r.get("/jobs/{job_id}")
    async def job_usage(job_id: str, caller: Caller = require("read")) -> dict:
        x_tenant_id = caller.tenant_id
        async with rt.uow() as uow:
            rows = await uow.conn.fetch("SELECT * FROM ledger WHERE job_id = $1 AND tenant_id = $2 ORDER BY id",
                                        job_id, x_tenant_id)
            job = await uow.conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1 AND tenant_id = $2", job_id, x_tenant_id)
            waiting = await uow.conn.fetch(
                "SELECT segment_id, start IS NOT NULL AS started, stop IS NOT NULL AS stopped FROM segments"
                " WHERE job_id = $1 AND tenant_id = $2 AND waiting ORDER BY segment_id", job_id, x_tenant_id)
            anomalies = await uow.conn.fetch(
                "SELECT segment_id, code, reason, event_ids, created_at, resolved_at, resolution FROM anomalies"
                " WHERE job_id = $1 AND tenant_id = $2 ORDER BY id", job_id, x_tenant_id)
        if job is None:
            raise HTTPException(404, {"code": "no_usage", "message": f"no metered usage for {job_id} yet"})
        segment_rows = [x for x in rows if x["scope"] == "segment"]
        # the job's current total: its last charge (an outcome corrected after close reverses the first)
        total_row = next((x for x in reversed(rows) if x["scope"] == "job" and x["entry"] == "charge"), None)
        return {"job_id": job_id, "tenant_id": x_tenant_id, "status": "closed" if total_row else "open",
                "total": _total(total_row, segment_rows) if total_row else None,
                "lines": [_entry(x) for x in _current_lines(segment_rows)],
                "entries": [_entry(x) for x in rows],
                "waiting_segments": [dict(w) for w in waiting],
                "anomalies": [_anomaly(a) for a in anomalies]}

    @r.get("/lines/{line_id}/events")
    async def line_events(line_id: int, caller: Caller = require("read")) -> dict:
        """Audit: the events that produced a ledger line."""
        x_tenant_id = caller.tenant_id
        async with rt.uow() as uow:
            line = await uow.conn.fetchrow("SELECT * FROM ledger WHERE id = $1 AND tenant_id = $2", line_id,
                                           x_tenant_id)
            if line is None:
                raise HTTPException(404, {"code": "no_such_line", "message": f"no ledger line {line_id}"})
            events = await uow.conn.fetch("SELECT * FROM events WHERE job_id = $1 AND event_id = ANY($2::text[])"
                                          " ORDER BY occurred_at, event_id", line["job_id"], list(line["source_events"]))
        return {"line": _entry(line), "events": [_audit_event(e) for e in events]}

    @r.get("")
    async def my_usage(caller: Caller = require("read"), month: str | None = Query(None, pattern=r"^\d{4}-\d{2}$")) -> dict:
        """The caller's tenant, one month (default: the current one)."""
        return await month_of(caller.tenant_id, month or datetime.now(UTC).strftime("%Y-%m"))

    @r.get("/tenants/{tenant_id}")
    async def tenant_usage(tenant_id: str, caller: Caller = require("read"),
                           month: str | None = Query(None, pattern=r"^\d{4}-\d{2}$")) -> dict:
        """One tenant's month (default: the current one); a tenant's own admin key, or an operator."""
        if tenant_id != caller.tenant_id and not caller.operator:   # a tenant's admin key sees its own tenant
            raise HTTPException(404, {"code": "unknown_tenant", "message": f"no usage for tenant {tenant_id}",
                                      "param": "tenant_id"})
        return await month_of(tenant_id, month or datetime.now(UTC).strftime("%Y-%m"))

    async def month_of(tenant_id: str, month: str) -> dict:
        async with rt.uow() as uow:
            usage = await uow.conn.fetch("SELECT * FROM usage_monthly WHERE tenant_id = $1 AND period = $2",
                                         tenant_id, month)
            jobs = await uow.conn.fetch("SELECT outcome, jobs FROM jobs_monthly WHERE tenant_id = $1 AND period = $2",
                                        tenant_id, month)
        return tenant_month(tenant_id, month, usage, {j["outcome"]: j["jobs"] for j in jobs})

    @r.get("/anomalies")
    async def open_anomalies(caller: Caller = require("admin"), limit: int = Query(100, le=1000)) -> dict:
        operator_only(caller)
        async with rt.uow() as uow:
            rows = await uow.conn.fetch(
                "SELECT job_id, tenant_id, segment_id, code, reason, event_ids, created_at, resolved_at, resolution"
                " FROM anomalies WHERE resolved_at IS NULL ORDER BY id LIMIT $1", limit)
        return {"data": [{"job_id": a["job_id"], "tenant_id": a["tenant_id"], **_anomaly(a)} for a in rows]}

    @r.get("/reviews")
    async def pending_reviews(caller: Caller = require("admin"), limit: int = Query(100, le=1000)) -> dict:
        operator_only(caller)
        async with rt.uow() as uow:
            rows = await uow.conn.fetch(
                "SELECT job_id, tenant_id, count(*) AS segments, sum((billed->>'list_cost')::numeric) AS held"
                " FROM segments WHERE billed->>'charge_class' = 'review' GROUP BY 1, 2 ORDER BY 1 LIMIT $1", limit)
        return {"data": [{"job_id": x["job_id"], "tenant_id": x["tenant_id"], "segments": x["segments"],
                          "held_usd": float(x["held"])} for x in rows]}

    @r.post("/jobs/{job_id}/review")
    async def review(job_id: str, body: ReviewDecision, caller: Caller = require("admin")) -> dict:
        operator_only(caller)
        result = await review_job(rt, job_id, body.decision, f"{caller.tenant_id}/{caller.key_id}", body.note)
        if result is None:
            raise HTTPException(404, {"code": "no_usage", "message": f"no metered usage for {job_id}"})
        if not result.entries:
            raise HTTPException(409, {"code": "nothing_to_review", "message": f"{job_id} holds nothing for review"})
        return {"job_id": job_id, "decision": body.decision, "entries": len(result.entries)}

    return r


def _audit_event(e) -> dict:
    envelope = json.loads(e["envelope"])
    return {"event_id": e["event_id"], "event_type": e["event_type"], "segment_id": e["segment_id"],
            "occurred_at": e["occurred_at"].isoformat(), "received_at": e["received_at"].isoformat(),
            "producer": envelope.get("producer"), "trace_id": envelope.get("trace_id"),
            "payload": envelope.get("payload")}


def _anomaly(a) -> dict:
    return {"segment_id": a["segment_id"], "code": a["code"], "reason": a["reason"], "event_ids": list(a["event_ids"]),
            "created_at": a["created_at"].isoformat(),
            "resolved_at": a["resolved_at"].isoformat() if a["resolved_at"] else None, "resolution": a["resolution"]}


def tenant_month(tenant_id: str, month: str, usage: list, jobs: dict[str, int]) -> dict:
    n = sum(jobs.values())
    by_gpu: dict[str, dict] = {}
    for u in usage:
        g = by_gpu.setdefault(u["gpu_type"], {"gpu_type": u["gpu_type"], "gpu_hours": 0.0, "billable_gpu_hours": 0.0,
                                               "spend": Decimal(0)})
        g["gpu_hours"] += float(u["gpu_seconds"]) / 3600
        g["billable_gpu_hours"] += float(u["billable_gpu_seconds"]) / 3600
        g["spend"] += u["cost"]

    def by_class(klass: str) -> float:
        return float(sum((u["list_cost"] for u in usage if u["charge_class"] == klass), Decimal(0)))

    return {"tenant_id": tenant_id, "month": month, "currency": "USD", "jobs": n,
            "succeeded": jobs.get("succeeded", 0), "failed": jobs.get("failed", 0),
            "cancelled": jobs.get("cancelled", 0), "success_rate": jobs.get("succeeded", 0) / n if n else None,
            "gpu_hours": sum(g["gpu_hours"] for g in by_gpu.values()),
            "billable_gpu_hours": sum(g["billable_gpu_hours"] for g in by_gpu.values()),
            "spend": float(sum((g["spend"] for g in by_gpu.values()), Decimal(0))),
            "refunded": by_class("refunded"), "under_review": by_class("review"),
            "by_gpu_type": [{**g, "spend": float(g["spend"])} for g in sorted(by_gpu.values(), key=lambda g: g["gpu_type"])]}
