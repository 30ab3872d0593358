"""Public job API, shaped like OpenAI's fine-tuning API. Tenant from the X-Tenant-Id header;
a tenant only ever sees its own jobs (another tenant's job id answers 404)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Header, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from whetstone.contracts import Hyperparameters, JobRequestedV1, ResourceRequest, job_id_for
from whetstone.runtime.service import Runtime

from . import handlers as H
from .domain import jobs as J
from .domain.policy import Forecast

# The caller's trace id (X-Trace-Id) follows the job through every event; a fresh one otherwise.
TRACE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class CreateJob(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    training_file: str
    validation_file: str | None = None
    method: str = "lora"
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    suffix: str | None = None
    tier: str | None = None
    idempotency_key: str | None = None
    resources: Literal["auto"] | ResourceRequest = "auto"


def _ts(t: datetime | None) -> int | None:
    return int(t.timestamp()) if t else None


def job_view(job: dict, queue: Forecast | None = None) -> dict[str, Any]:
    req, spec, res = job["request"], job["spec"] or {}, job["resources"] or {}
    view = {
        "id": job["job_id"], "object": "fine_tuning.job", "tenant_id": job["tenant_id"],
        "model": req["model"], "training_file": req["training_file"], "validation_file": req.get("validation_file"),
        "method": req["method"], "status": job["status"], "tier": job["tier"],
        "created_at": _ts(job["created_at"]), "finished_at": _ts(job["finished_at"]),
        "hyperparameters": spec.get("hyperparameters") or req.get("hyperparameters"),
        "base_model_sha256": spec.get("base_model_sha256"),
        "dataset_version": spec.get("dataset_version"),
        "trained_tokens": job["trained_tokens"], "error": job["error"],
        "progress": job["progress"], "latest_checkpoint": job["latest_checkpoint"],
        "node_id": job["node_id"], "placement": job["placement"], "attempt": job["attempt"], "eval": job["eval"],
        "idempotency_key": job["idempotency_key"], "trace_id": job["trace_id"],
        "resources": {k: res.get(k) for k in ("request", "shapes", "assigned", "memory_gb", "params", "params_source")},
        "estimated_runtime_s": job["estimated_runtime_s"],
        "quota": job["quota"],
        "preemptions": {"spot": job["spot_preemptions"], "priority": job["priority_preemptions"]},
        "preemption_requested": {"at": _ts(job["preempt_requested_at"]), "reason": job["preempt_reason"],
                                 "for_job": job["preempted_for"]} if job["preempt_requested_at"] else None,
        "queue_position": None, "estimated_start_at": None,
    }
    if job["status"] == J.QUEUED and queue is not None:
        view["queue_position"] = queue.position
        view["estimated_start_at"] = int(queue.estimated_start) if queue.estimated_start is not None else None
    return view


def routes(rt: Runtime) -> APIRouter:
    r = APIRouter(prefix="/v1/fine_tuning")

    async def owned(uow, job_id: str, tenant: str, lock: bool = False) -> dict:
        job = await H.get_job(uow, job_id, lock=lock)
        if job is None or job["tenant_id"] != tenant:  # never reveal other tenants' jobs
            raise HTTPException(404, {"code": "job_not_found", "message": f"no job {job_id}"})
        return job

    async def with_queue(uow, jobs: list[dict]) -> list[dict]:
        forecasts = await H.queue_forecasts(rt, uow) if any(j["status"] == J.QUEUED for j in jobs) else {}
        out = []
        for j in jobs:
            f = forecasts.get(j["job_id"])
            if f is None and j["status"] == J.QUEUED:
                f = Forecast(await H.queue_position(uow, j), None)
            out.append(job_view(j, f))
        return out

    @r.post("/jobs")
    async def create(body: CreateJob, x_tenant_id: str = Header(...),
                     idempotency_key: str | None = Header(default=None),
                     x_trace_id: str | None = Header(default=None)) -> dict:
        key = body.idempotency_key or idempotency_key
        if x_trace_id is not None and not TRACE_ID.fullmatch(x_trace_id):
            raise HTTPException(400, {"code": "invalid_trace_id",
                                      "message": "X-Trace-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -"})
        if not key:
            raise HTTPException(400, {"code": "missing_idempotency_key",
                                      "message": "send an Idempotency-Key header or idempotency_key field"})
        try:
            req = JobRequestedV1(job_id=job_id_for(x_tenant_id, key), idempotency_key=key,
                                 resources=body.resources if isinstance(body.resources, ResourceRequest) else None,
                                 **body.model_dump(exclude={"idempotency_key", "resources"}))
        except ValueError as exc:
            raise HTTPException(422, {"code": "invalid_request", "message": str(exc)}) from exc
        try:
            async with rt.uow() as uow:
                job, _created = await H.submit_job(rt, uow, x_tenant_id, req, x_trace_id)
        except H.Rejected as exc:
            H.metrics(rt).rejected.labels(code=exc.code).inc()
            raise HTTPException(exc.status, {"code": exc.code, "message": exc.message}) from exc
        except H.IdempotencyConflict as exc:
            raise HTTPException(409, {"code": "idempotency_conflict", "message": str(exc)}) from exc
        async with rt.uow() as uow:
            fresh = await H.get_job(uow, job["job_id"]) or job
            return (await with_queue(uow, [fresh]))[0]

    @r.get("/jobs")
    async def list_jobs(x_tenant_id: str = Header(...), after: str | None = None,
                        limit: int = Query(20, ge=1, le=100)) -> dict:
        async with rt.uow() as uow:
            cursor = await uow.conn.fetchrow("SELECT created_at, job_id FROM jobs WHERE job_id = $1 AND tenant_id = $2",
                                             after, x_tenant_id) if after else None
            rows = await uow.conn.fetch(
                "SELECT * FROM jobs WHERE tenant_id = $1 AND ($2::timestamptz IS NULL OR (created_at, job_id) < ($2, $3))"
                " ORDER BY created_at DESC, job_id DESC LIMIT $4",
                x_tenant_id, cursor["created_at"] if cursor else None, cursor["job_id"] if cursor else "", limit + 1)
            data = await with_queue(uow, [dict(x) for x in rows[:limit]])
        return {"object": "list", "data": data, "has_more": len(rows) > limit,
                "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}

    @r.get("/jobs/{job_id}")
    async def get(job_id: str, x_tenant_id: str = Header(...)) -> dict:
        async with rt.uow() as uow:
            return (await with_queue(uow, [await owned(uow, job_id, x_tenant_id)]))[0]

    @r.post("/jobs/{job_id}/cancel")
    async def cancel(job_id: str, x_tenant_id: str = Header(...)) -> dict:
        async with rt.uow() as uow:
            job = await owned(uow, job_id, x_tenant_id, lock=True)
            if job["status"] in J.TERMINAL or job["status"] == J.EVALUATING:
                raise HTTPException(409, {"code": "not_cancellable", "message": f"job is {job['status']}"})
            await H.cancel_job(rt, uow, job)
            return job_view(job)

    @r.get("/jobs/{job_id}/events")
    async def events(job_id: str, x_tenant_id: str = Header(...), after: int = 0,
                     limit: int = Query(50, ge=1, le=500)) -> dict:
        async with rt.uow() as uow:
            await owned(uow, job_id, x_tenant_id)
            rows = await uow.conn.fetch("SELECT * FROM job_events WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                                        job_id, after, limit + 1)
        return {"object": "list", "has_more": len(rows) > limit, "data": [
            {"id": r["id"], "object": "fine_tuning.job.event", "created_at": int(r["created_at"].timestamp()),
             "level": r["level"], "message": r["message"], "data": r["data"]} for r in rows[:limit]]}

    return r
