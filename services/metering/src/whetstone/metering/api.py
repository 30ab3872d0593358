"""Usage API: a job's ledger with the events behind each line; a tenant's month."""

from __future__ import annotations

from fastapi import APIRouter, Header, HTTPException, Query

from whetstone.runtime.service import Runtime


def _line(r) -> dict:
    return {"scope": r["scope"], "segment_id": r["segment_id"] or None, "gpu_type": r["gpu_type"],
            "gpu_count": r["gpu_count"], "gpu_seconds": r["gpu_seconds"],
            "billable_gpu_seconds": r["billable_gpu_seconds"], "charge_class": r["charge_class"],
            "cost": float(r["cost"]), "price_version": r["price_version"], "source_events": r["source_events"],
            "created_at": r["created_at"].isoformat()}


def routes(rt: Runtime) -> APIRouter:
    r = APIRouter(prefix="/v1/usage")

    @r.get("/jobs/{job_id}")
    async def job_usage(job_id: str, x_tenant_id: str = Header(...)) -> dict:
        async with rt.uow() as uow:
            rows = await uow.conn.fetch("SELECT * FROM ledger WHERE job_id = $1 AND tenant_id = $2 ORDER BY id",
                                        job_id, x_tenant_id)
            anomalies = await uow.conn.fetch("SELECT reason, segment_id FROM anomalies WHERE job_id = $1", job_id)
        if not rows and not anomalies:
            raise HTTPException(404, {"code": "no_usage", "message": f"no metered usage for {job_id} yet"})
        total = next((_line(x) for x in rows if x["scope"] == "job"), None)
        return {"job_id": job_id, "total": total, "lines": [_line(x) for x in rows if x["scope"] == "segment"],
                "anomalies": [dict(a) for a in anomalies]}

    @r.get("/tenants/{tenant_id}")
    async def tenant_usage(tenant_id: str, x_tenant_id: str = Header(...),
                           month: str = Query(..., pattern=r"^\d{4}-\d{2}$")) -> dict:
        if tenant_id != x_tenant_id:
            raise HTTPException(403, {"code": "forbidden", "message": "tenants see only their own usage"})
        async with rt.uow() as uow:
            row = await uow.conn.fetchrow(
                "SELECT count(*) AS jobs, coalesce(sum(billable_gpu_seconds), 0) / 3600 AS gpu_hours,"
                " coalesce(sum(cost), 0) AS spend FROM ledger WHERE tenant_id = $1 AND scope = 'job'"
                " AND to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM') = $2", tenant_id, month)
        return {"tenant_id": tenant_id, "month": month, "jobs": row["jobs"], "gpu_hours": float(row["gpu_hours"]),
                "spend": float(row["spend"])}

    return r
