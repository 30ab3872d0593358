"""Registry API: OpenAI-compatible models (with stage and lineage as extensions), stage changes,
downloads, and the base-model catalog. Thin: the use cases apply what the domain decides, the
store holds the SQL."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from whetstone.contracts.enums import ModelStage
from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import ListObject, ListPage, list_object, list_page, operator_only
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters.store import ModelStore
from ..context import RegistryContext
from ..domain.stages import ModelRecord, TransitionRefused
from ..usecases import base_listing, base_models, downloads, merges, promotion
from ..usecases.downloads import MergedWeights, ModelContent, model_not_found
from ..usecases.base_listing import BaseListing
from .views import BaseModelVersions, BaseModelView, BaseVersionView, ModelView


class PromoteRequest(BaseModel):
    stage: ModelStage = Field(description="target stage")
    reason: str = Field(min_length=1, max_length=2000)


class ReasonRequest(BaseModel):
    reason: str = Field("requested by the tenant", min_length=1, max_length=2000)


class NewVersion(BaseModel):
    sha256: str = Field(max_length=64, description="the new pinned revision: a 64-hex sha256 (or a 40-hex git commit)")
    uri: str | None = Field(None, max_length=2000, description="where the new weights are")
    reason: str = Field("new base-model revision", min_length=1, max_length=2000)


def refused(exc: TransitionRefused) -> ApiError:
    return ApiError(exc.status, exc.message, code=exc.code, param="stage" if exc.code == "invalid_stage" else None,
                    type="permission_error" if exc.status == 403 else "invalid_request_error")


async def model_view(store: ModelStore, m: ModelRecord, *, detail: bool = True) -> ModelView:
    if not detail:
        return ModelView.of(m)
    return ModelView.of(m, (await store.stored_lineage(m.model_id), await store.history(m.model_id)))


def routes(rt: Runtime[RegistryContext]) -> APIRouter:
    r = APIRouter(prefix="/v1/models")
    cfg = rt.ctx.config
    catalog = rt.settings.model_catalog

    async def internal_id(ref: str, tenant_id: str) -> str:
        """The internal id of the tenant's version named by its public or internal id (else `ref` itself)."""
        async with rt.uow() as uow:
            model = await ModelStore(uow.conn).get(ref, tenant_id)
        return model.model_id if model else ref

    @r.get("")
    async def list_models(caller: Caller = require("read"), job_id: str | None = None, name: str | None = None,
                          after: str | None = None, limit: int = Query(100, ge=1, le=1000),
                          lineage: bool | None = None) -> ListPage[ModelView | BaseListing]:
        """The tenant's fine-tuned versions, newest first, then the platform's base models (not when
        filtering by job or name)."""
        lineage = lineage if lineage is not None else job_id is not None  # one job: its model, in full
        async with rt.uow() as uow:
            store = ModelStore(uow.conn)
            bases = [] if job_id or name else await base_listing.base_models(store, catalog)
            in_bases = after is not None and any(b.id == after for b in bases)
            rows = [] if in_bases else await store.page(caller.tenant_id, job_id=job_id, name=name, after=after,
                                                         limit=limit + 1)
            models = [await model_view(store, m, detail=lineage) for m in rows[:limit]]
        page, has_more = base_listing.page_with_bases(models, len(rows) > limit, bases, after, limit)
        return list_page(page, has_more)

    @r.get("/{model_id}")
    async def get(model_id: str, caller: Caller = require("read")) -> ModelView | BaseListing:
        async with rt.uow() as uow:
            store = ModelStore(uow.conn)
            model = await store.resolve(model_id, caller.tenant_id)  # a public or internal id, or a name
            if model is not None:
                return await model_view(store, model)
            base = await base_listing.base_model(store, catalog, model_id)
        if base is None:
            raise model_not_found(model_id)
        return base

    async def change(model_id: str, action: Callable[[UnitOfWork, ModelStore], Awaitable[ModelRecord]]) -> ModelView:
        try:
            async with rt.uow() as uow:
                store = ModelStore(uow.conn)
                model = await action(uow, store)
                return await model_view(store, model)
        except LookupError:
            raise model_not_found(model_id) from None
        except TransitionRefused as exc:
            raise refused(exc) from None

    @r.post("/{model_id}/promote")
    async def promote(model_id: str, body: PromoteRequest, caller: Caller = require("read")) -> ModelView:
        if not (caller.allows("write") or caller.allows("models:promote")):   # either scope may promote
            raise ApiError(403, "Promoting a model needs the `models:promote` scope (or `write` for dev and "
                           "staging); this API key has neither.", code="insufficient_scope", param="scope")
        model_id = await internal_id(model_id, caller.tenant_id)
        return await change(model_id, lambda uow, store: promotion.promote(
            uow, store, model_id, caller.tenant_id, body.stage, body.reason,
            can_approve=caller.allows("models:promote"), actor=caller.key_id, min_margin=cfg.auto_promote_min_margin))

    @r.post("/{model_id}/rollback")
    async def rollback(model_id: str, body: ReasonRequest | None = None,
                       caller: Caller = require("models:promote")) -> ModelView:
        reason = (body or ReasonRequest()).reason
        model_id = await internal_id(model_id, caller.tenant_id)
        return await change(model_id, lambda uow, store: promotion.rollback(
            uow, store, model_id, caller.tenant_id, reason, caller.key_id))

    async def archive(model_id: str, reason: str, caller: Caller) -> ModelView:
        model_id = await internal_id(model_id, caller.tenant_id)
        return await change(model_id, lambda uow, store: promotion.archive(
            uow, store, model_id, caller.tenant_id, reason, caller.key_id, can_approve=caller.allows("models:promote")))

    @r.post("/{model_id}/archive")
    async def archive_model(model_id: str, body: ReasonRequest | None = None,
                            caller: Caller = require("write")) -> ModelView:
        return await archive(model_id, (body or ReasonRequest()).reason, caller)

    @r.delete("/{model_id}")
    async def delete(model_id: str, caller: Caller = require("write")) -> dict:
        """OpenAI's delete: the version is archived (history and artifact are kept for lineage). A name
        names its current version (production, else the newest staging or dev one)."""
        async with rt.uow() as uow:
            store = ModelStore(uow.conn)
            model = await store.resolve(model_id, caller.tenant_id)
            base = None if model else await base_listing.base_model(store, catalog, model_id)
        if base is not None:
            raise ApiError(403, f"The model '{model_id}' is a base model of the platform; only fine-tuned models can "
                           "be deleted.", code="model_not_deletable", param="model", type="permission_error")
        if model is None:
            raise model_not_found(model_id)
        try:
            await archive(model.model_id, "deleted by the tenant", caller)
        except ApiError as exc:
            if exc.code != "already_in_stage":
                raise
        return {"id": model_id, "object": "model", "deleted": True}

    @r.get("/{model_id}/content")
    @r.get("/{model_id}/download")
    async def content(model_id: str, caller: Caller = require("read")) -> ModelContent:
        return await downloads.adapter_download(rt, caller.tenant_id, await internal_id(model_id, caller.tenant_id))

    @r.get("/{model_id}/files/{name}")
    async def adapter_file(model_id: str, name: str, caller: Caller = require("read")) -> StreamingResponse:
        chunks = await downloads.adapter_file(rt, caller.tenant_id, await internal_id(model_id, caller.tenant_id), name)
        return StreamingResponse(chunks, media_type="application/octet-stream")

    @r.get("/{model_id}/merged/files/{name:path}")
    async def merged_file(model_id: str, name: str, caller: Caller = require("read")) -> StreamingResponse:
        chunks = await downloads.merged_file(rt, caller.tenant_id, await internal_id(model_id, caller.tenant_id), name)
        return StreamingResponse(chunks, media_type="application/octet-stream")

    @r.post("/{model_id}/merged")
    async def request_merge(model_id: str, caller: Caller = require("write")) -> MergedWeights:
        return await merges.request_merge(rt, caller.tenant_id, await internal_id(model_id, caller.tenant_id))

    @r.get("/{model_id}/merged")
    async def merged(model_id: str, caller: Caller = require("read")) -> MergedWeights:
        return await downloads.merged_download(rt, caller.tenant_id, await internal_id(model_id, caller.tenant_id))

    return r


def base_model_routes(rt: Runtime[RegistryContext]) -> APIRouter:
    r = APIRouter(prefix="/v1/base_models")

    @r.get("")
    async def catalog(caller: Caller = require("read")) -> ListObject[BaseModelView]:
        async with rt.uow() as uow:
            entries = await ModelStore(uow.conn).bases()
        return list_object([BaseModelView.of(b) for b in entries])

    @r.get("/{name:path}/rollout-check")
    async def check(name: str, caller: Caller = require("admin")) -> dict:
        operator_only(caller)
        async with rt.uow() as uow:
            result = await base_models.check_rollout(ModelStore(uow.conn), name)
        return {"object": "base_model.rollout_check", **asdict(result)}

    @r.post("/{name:path}/versions")
    async def publish(name: str, body: NewVersion, caller: Caller = require("admin")) -> dict:
        operator_only(caller)
        async with rt.uow() as uow:
            published = await base_models.publish_version(uow, ModelStore(uow.conn), name, body.sha256, body.uri,
                                                          body.reason, caller.key_id or "admin")
        return asdict(published)

    @r.get("/{name:path}")
    async def versions(name: str, caller: Caller = require("read")) -> BaseModelVersions:
        async with rt.uow() as uow:
            store = ModelStore(uow.conn)
            base = await base_models.known(store, name)
            history = [BaseVersionView.of(v, operator=caller.operator) for v in await store.base_versions(name)]
        return BaseModelVersions(**BaseModelView.of(base).model_dump(), versions=history)

    return r
