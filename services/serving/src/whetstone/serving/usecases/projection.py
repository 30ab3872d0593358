"""The projection of servable models: written by the registry's events, followed by the adapter pool.

The event use cases only write the projection inside their unit of work, with a Postgres NOTIFY that
is delivered when it commits; loading weights is long work, done by `sync_projection` when the
notification arrives (it reads the projection's change sequence, so every replica follows every
change whichever replica consumed the event). Promotion to staging/production starts the cold load
at once (prefetch), so the first request usually finds the adapter resident."""

from __future__ import annotations

import asyncio

from whetstone.contracts import CheckpointWrittenV1, ModelPromotedV1, ModelRegisteredV1
from whetstone.contracts.enums import ModelStage
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.s3 import within_tenant
from whetstone.runtime.service import Runtime

from ..adapters.repository import AsyncpgServingRepository
from ..context import ServingContext
from ..domain.catalog import ModelVersion, check_servable_on
from ..domain.full_models import is_full_weights

PAGE = 500   # projection changes read per round trip


async def model_registered(rt: Runtime[ServingContext], uow: UnitOfWork, tenant_id: str,
                           ev: ModelRegisteredV1) -> None:
    await _same_owner(uow, ev.model_id, tenant_id)
    _own_uri(rt, ev.artifact_uri, tenant_id, "artifact_uri")
    lineage = ev.lineage
    await rt.ctx.repo.record_registered(uow.conn, ModelVersion(
        model_id=ev.model_id, tenant_id=tenant_id, name=ev.name, stage=ev.stage, artifact_uri=ev.artifact_uri,
        artifact_sha256=ev.artifact_sha256, files=dict(ev.files),
        base_model=lineage.base_model, base_model_sha256=lineage.base_model_sha256,
        chat_template_sha256=lineage.chat_template_sha256, fine_tuned_model=ev.fine_tuned_model,
        job_id=lineage.job_id))
    await rt.ctx.repo.notify_changed(uow.conn)


async def model_promoted(rt: Runtime[ServingContext], uow: UnitOfWork, tenant_id: str, ev: ModelPromotedV1) -> None:
    await _same_owner(uow, ev.model_id, tenant_id)
    _own_uri(rt, ev.artifact_uri, tenant_id, "artifact_uri")
    applied = await rt.ctx.repo.record_promoted(uow.conn, ModelVersion(
        model_id=ev.model_id, tenant_id=tenant_id, name=ev.name or "", stage=ModelStage(ev.to_stage),
        artifact_uri=ev.artifact_uri, artifact_sha256=ev.artifact_sha256, files=dict(ev.files),
        base_model=ev.base_model, base_model_sha256=ev.base_model_sha256,
        chat_template_sha256=ev.chat_template_sha256, fine_tuned_model=ev.fine_tuned_model), ev.sequence)
    if not applied:
        rt.log.info("stale stage change ignored", model_id=ev.model_id, sequence=ev.sequence, to_stage=ev.to_stage)
    await rt.ctx.repo.notify_changed(uow.conn)


async def checkpoint_written(rt: Runtime[ServingContext], uow: UnitOfWork, tenant_id: str,
                             ev: CheckpointWrittenV1) -> None:
    """Every durable checkpoint, so `<fine_tuned_model>:ckpt-step-<N>` can be served (see catalog.checkpoint_version)."""
    _own_uri(rt, ev.uri, tenant_id, "uri")
    await rt.ctx.repo.record_checkpoint(uow.conn, tenant_id, ev.job_id, ev.step, ev.uri, ev.manifest_sha256,
                                        ev.attempt)


def _own_uri(rt: Runtime[ServingContext], uri: str | None, tenant_id: str, field: str) -> None:
    """Serving loads only weights under the event tenant's own prefix of the platform's bucket: an
    event naming another tenant's artifact (or another bucket) is dead-lettered, never loaded. An
    event without one (a promotion that names no artifact) has nothing to check."""
    if uri is not None and not within_tenant(uri, tenant_id, rt.settings.bucket):
        raise PoisonMessage(f"{field} {uri!r} is not under tenant {tenant_id}'s prefix "
                            f"s3://{rt.settings.bucket}/tenants/{tenant_id}/", reason="tenant_mismatch")


async def _same_owner(uow: UnitOfWork, model_id: str, tenant_id: str) -> None:
    owner = await AsyncpgServingRepository.owner(uow.conn, model_id)
    if owner is not None and owner != tenant_id:
        raise PoisonMessage(f"model {model_id} belongs to another tenant than the event's ({tenant_id})")


async def sync_projection(rt: Runtime[ServingContext], *, act: bool) -> int:
    """Bring the in-memory catalog up to the committed projection; with `act`, also load adapters
    promoted to staging/production and unload archived ones. Returns how many changes it saw."""
    ctx = rt.ctx
    seen = 0
    while True:
        changes = await ctx.repo.changes_since(ctx.synced_to, PAGE)
        for change_seq, version in changes:
            ctx.synced_to = max(ctx.synced_to, change_seq)
            ctx.catalog.put(version)
            if not act:
                continue
            if is_full_weights(version):   # a base of its own: loaded on its first request, within its budget
                if not version.servable:
                    await ctx.full_models.unload(version.model_id)
            elif not version.servable:
                await ctx.pool.unload(version.model_id)
            elif ctx.config.preload:
                task = asyncio.create_task(_preload(rt, version))
                ctx.background.add(task)
                task.add_done_callback(ctx.background.discard)
        seen += len(changes)
        if len(changes) < PAGE:
            break
    for change_seq, tenant_id, name, route in await ctx.repo.route_changes_since(ctx.synced_to_routes):
        ctx.synced_to_routes = max(ctx.synced_to_routes, change_seq)
        ctx.catalog.put_route(tenant_id, name, route)
        seen += 1
    ctx.metrics.resident.set(len(ctx.pool.lru))
    return seen


async def _preload(rt: Runtime[ServingContext], version: ModelVersion) -> None:
    try:
        check_servable_on(version, rt.ctx.base_sha256)
        await rt.ctx.pool.preload(version)
        rt.log.info("adapter loaded", model_id=version.model_id, name=version.name, stage=version.stage)
    except Exception as exc:  # refused adapters are answered per request with the reason
        rt.log.warning("adapter not loaded", model_id=version.model_id, name=version.name,
                       error=f"{type(exc).__name__}: {exc}")
