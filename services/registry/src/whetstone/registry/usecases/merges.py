"""Merged weights: the answer to a merge request (model.merged) recorded once, for the tenant that asked."""

from __future__ import annotations

from whetstone.contracts import ModelMergedV1
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.service import Runtime

from ..adapters.store import ModelStore
from ..context import RegistryContext
from .registration import owned_by


async def merge_answered(rt: Runtime[RegistryContext], uow: UnitOfWork, tenant_id: str, ev: ModelMergedV1) -> None:
    store = ModelStore(uow.conn)
    model = await store.get(ev.model_id)
    if model is not None and model.tenant_id != tenant_id:
        raise PoisonMessage(f"merge answer for model {ev.model_id} names tenant {tenant_id!r}, not the model's own",
                            reason="tenant_mismatch")
    if ev.uri and not owned_by(ev.uri, tenant_id):
        raise PoisonMessage(f"merged weights of {ev.merge_id} ({ev.uri}) are not under tenant {tenant_id}'s prefix",
                            reason="tenant_mismatch")
    done = await store.complete_merge(ev.merge_id, ev.status, ev.uri, ev.manifest_sha256, dict(ev.files),
                                      ev.merge_job_id, ev.error, tenant_id)
    if not done:
        rt.log.warning("merge answer for an unknown or finished merge", merge_id=ev.merge_id)
