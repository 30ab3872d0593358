"""Public job API, shaped like OpenAI's fine-tuning API. Tenant from the X-Tenant-Id header."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from whetstone.contracts import Hyperparameters, JobRequestedV1, job_id_for
from whetstone.runtime.service import Runtime

from . import handlers as H
from .domain import jobs as J


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


def job_view(job: dict) -> dict[str, Any]:
    req, spec = job["request"], job["spec"] or {}
    return {
        "id": job["job_id"], "object": "fine_tuning.job", "tenant_id": job["tenant_id"],
        "model": req["model"], "training_file": req["training_file"], "validation_file": req.get("validation_file"),
        "method": req["method"], "status": job["status"], "tier": job["tier"],
        "created_at": int(job["created_at"].timestamp()),
        "finished_at": int(job["finished_at"].timestamp()) if job["finished_at"] else None,
        "hyperparameters": spec.get("hyperparameters") or req.get("hyperparameters"),
        "base_model_sha256": spec.get("base_model_sha256"),
        "dataset_version": spec.get("dataset_version"),
        "trained_tokens": job["trained_tokens"], "error": job["error"],
        "progress": job["progress"], "latest_checkpoint": job["latest_checkpoint"],
        "node_id": job["node_id"], "attempt": job["attempt"], "eval": job["eval"],
        "idempotency_key": job["idempotency_key"],
    }


def routes(rt: Runtime) -> APIRouter:
    r = APIRouter(prefix="/v1/fine_tuning")

    async def owned(uow, job_id: str, tenant: str) -> dict:
        job = await H.get_job(uow, job_id)
        if job is None or job["tenant_id"] != tenant:  # never reveal other tenants' jobs
            raise HTTPException(404, {"code": "job_not_found", "message": f"no job {job_id}"})
        return job

    @r.post("/jobs")
    async def create(body: CreateJob, x_tenant_id: str = Header(...),
                     idempotency_key: str | None = Header(default=None)) -> dict:
        key = body.idempotency_key or idempotency_key
        if not key:
            raise HTTPException(400, {"code": "missing_idempotency_key",
                                      "message": "send an Idempotency-Key header or idempotency_key field"})
        try:
            req = JobRequestedV1(job_id=job_id_for(x_tenant_id, key), idempotency_key=key,
                                 **body.model_dump(exclude={"idempotency_key"}))
        except ValueError as exc:
            raise HTTPException(422, {"code": "invalid_request", "message": str(exc)}) from exc
        try:
            async with rt.uow() as uow:
                job, _created = await H.submit_job(rt, uow, x_tenant_id, req)
        except H.Rejected as exc:
            raise HTTPException(exc.status, {"code": exc.code, "message": exc.message}) from exc
        except H.IdempotencyConflict as exc:
            raise HTTPException(409, {"code": "idempotency_conflict", "message": str(exc)}) from exc
        return job_view(job)

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
        data = [job_view(dict(x)) for x in rows[:limit]]
        return {"object": "list", "data": data, "has_more": len(rows) > limit}

    @r.get("/jobs/{job_id}")
    async def get(job_id: str, x_tenant_id: str = Header(...)) -> dict:
        async with rt.uow() as uow:
            return job_view(await owned(uow, job_id, x_tenant_id))

    @r.post("/jobs/{job_id}/cancel")
    async def cancel(job_id: str, x_tenant_id: str = Header(...)) -> dict:
        async with rt.uow() as uow:
            job = await owned(uow, job_id, x_tenant_id)
            job = await H.get_job(uow, job_id, lock=True)
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
                                        job_id, after, limit)
        return {"object": "list", "data": [
            {"id": r["id"], "object": "fine_tuning.job.event", "created_at": int(r["created_at"].timestamp()),
             "level": r["level"], "message": r["message"], "data": r["data"]} for r in rows]}

    return r
