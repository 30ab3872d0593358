"""Registry API: a tenant's models with lineage and stage history."""

from __future__ import annotations

from fastapi import APIRouter, Header, HTTPException

from whetstone.runtime.service import Runtime


def routes(rt: Runtime) -> APIRouter:
    r = APIRouter(prefix="/v1/models")

    async def view(uow, row) -> dict:
        history = await uow.conn.fetch("SELECT from_stage, to_stage, reason, at FROM stage_history"
                                       " WHERE model_id = $1 ORDER BY id", row["model_id"])
        return {"id": row["model_id"], "object": "model", "name": row["name"], "stage": row["stage"],
                "job_id": row["job_id"], "artifact_uri": row["artifact_uri"],
                "artifact_sha256": row["artifact_sha256"], "lineage": row["lineage"],
                "created_at": int(row["created_at"].timestamp()),
                "stage_history": [{**dict(h), "at": h["at"].isoformat()} for h in history]}

    @r.get("")
    async def list_models(x_tenant_id: str = Header(...), job_id: str | None = None) -> dict:
        async with rt.uow() as uow:
            rows = await uow.conn.fetch("SELECT * FROM models WHERE tenant_id = $1 AND ($2::text IS NULL OR job_id = $2)"
                                        " ORDER BY created_at DESC LIMIT 100", x_tenant_id, job_id)
            return {"object": "list", "data": [await view(uow, x) for x in rows]}

    @r.get("/{model_id}")
    async def get(model_id: str, x_tenant_id: str = Header(...)) -> dict:
        async with rt.uow() as uow:
            row = await uow.conn.fetchrow("SELECT * FROM models WHERE model_id = $1 AND tenant_id = $2",
                                          model_id, x_tenant_id)
            if row is None:
                raise HTTPException(404, {"code": "model_not_found", "message": f"no model {model_id}"})
            return await view(uow, row)

    return r
