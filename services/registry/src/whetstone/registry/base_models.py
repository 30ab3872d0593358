"""Base-model catalog and the SHA drift guard (seed 001 "The SHA pinning problem").

Publishing a new SHA for a base marks every live adapter pinned to another SHA `needs_reeval`,
asks eval to re-run the gate against the new SHA (`eval.requested`), and the rollout check says
whether the serving fleet may move (every production adapter passed re-evaluation)."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from whetstone.contracts import BaseModelUpdatedV1, EvalRequestedV1
from whetstone.runtime.errors import ApiError
from whetstone.runtime.identity import PLATFORM_TENANT, Caller, require
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from .adapters.store import ModelStore
from .api import iso
from .context import RegistryContext
from .domain.drift import reeval_request_id, rollout_check

SHA_RE = re.compile(r"^[0-9a-f]{40}$|^[0-9a-f]{64}$")


class NewVersion(BaseModel):
    sha256: str = Field(max_length=64, description="the new pinned revision: a 64-hex sha256 (or a 40-hex git commit)")
    uri: str | None = Field(None, max_length=2000, description="where the new weights are")
    reason: str = Field("new base-model revision", min_length=1, max_length=2000)


async def _known(store: ModelStore, name: str) -> dict[str, Any]:
    base = await store.base(name)
    if base is None:
        raise ApiError(404, f"The base model '{name}' is not in the catalog", code="base_model_not_found", param="name")
    return base


async def publish_version(uow: UnitOfWork, store: ModelStore, name: str, sha256: str, uri: str | None, reason: str,
                          actor: str) -> dict[str, Any]:
    """The one way a new SHA enters the catalog (the admin route and the CLI call this)."""
    if not SHA_RE.match(sha256):
        raise ApiError(400, "sha256 must be 64 (or 40) lowercase hex characters", code="invalid_sha256", param="sha256")
    current = await store.base(name, for_update=True)
    previous = current["sha256"] if current else None
    if previous == sha256:
        raise ApiError(409, f"{name} is already pinned at {sha256}", code="already_current", param="sha256")
    if any(v["sha256"] == sha256 for v in await store.base_versions(name)):
        raise ApiError(409, f"{sha256} was published for {name} before; publish a new revision", code="sha_reused",
                       param="sha256")
    await store.publish_base_version(name, sha256, previous, uri, reason, actor)
    affected = await store.pinned_elsewhere(name, sha256)
    await store.mark_needs_reeval([m.model_id for m in affected])
    requested = []
    for m in affected:
        request_id = reeval_request_id(m.model_id, sha256)
        if not await store.add_reeval(request_id, m.model_id, name, sha256):
            continue
        lineage = await store.lineage(m.model_id) or {}
        await uow.publish(EvalRequestedV1(
            request_id=request_id, job_id=m.job_id, model_id=m.model_id, checkpoint_uri=m.artifact_uri,
            manifest_sha256=m.artifact_sha256, base_model=name, base_model_sha256=sha256, base_model_uri=uri,
            previous_base_model_sha256=lineage.get("base_model_sha256"), reason="base_model_updated"),
            tenant_id=m.tenant_id)
        requested.append(m.model_id)
    await uow.publish(BaseModelUpdatedV1(name=name, sha256=sha256, previous_sha256=previous, uri=uri, reason=reason),
                      tenant_id=PLATFORM_TENANT)
    return {"name": name, "sha256": sha256, "previous_sha256": previous, "needs_reeval": [m.model_id for m in affected],
            "eval_requested": requested}


def operator_only(caller: Caller) -> None:
    """Base models are shared by every tenant: only the platform's operator changes or surveys them."""
    if not caller.operator:
        raise ApiError(403, "Only the platform's operator may use this route.", type="permission_error",
                       code="operator_only")


def routes(rt: Runtime[RegistryContext]) -> APIRouter:
    r = APIRouter(prefix="/v1/base_models")

    @r.get("")
    async def catalog(caller: Caller = require("read")) -> dict:
        async with rt.uow() as uow:
            rows = await ModelStore(uow.conn).bases()
        return {"object": "list", "data": [{"id": b["name"], "object": "base_model", **_iso(b)} for b in rows]}

    @r.get("/{name:path}/rollout-check")
    async def check(name: str, caller: Caller = require("admin")) -> dict:
        operator_only(caller)
        async with rt.uow() as uow:
            store = ModelStore(uow.conn)
            base = await _known(store, name)
            result = rollout_check(name, base["sha256"], base["previous_sha256"],
                                   await store.production_adapters(name, base["sha256"]))
        return {"object": "base_model.rollout_check", **asdict(result)}

    @r.post("/{name:path}/versions")
    async def publish(name: str, body: NewVersion, caller: Caller = require("admin")) -> dict:
        operator_only(caller)
        async with rt.uow() as uow:
            return await publish_version(uow, ModelStore(uow.conn), name, body.sha256, body.uri, body.reason,
                                         caller.key_id or "admin")

    @r.get("/{name:path}")
    async def versions(name: str, caller: Caller = require("read")) -> dict:
        async with rt.uow() as uow:
            store = ModelStore(uow.conn)
            base = await _known(store, name)
            history = await store.base_versions(name)
        if not caller.operator:   # the first pin names a tenant's job: not another tenant's to see
            history = [{**v, "reason": "first pinned by a fine-tuning job"} if v["actor"] == "job.queued" else v
                       for v in history]
        return {"id": name, "object": "base_model", **_iso(base), "versions": [_iso(v) for v in history]}

    return r


def _iso(row: dict[str, Any]) -> dict[str, Any]:
    return {k: iso(v) for k, v in row.items()}
