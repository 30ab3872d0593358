"""Merged weights: a tenant asks for its model merged into the base (a job through the normal queue,
or the training job's own merged/ files when it saved them); the answer (model.merged) is recorded
once, for the tenant that asked."""

from __future__ import annotations


from whetstone.contracts import MergeRequestedV1, ModelMergedV1
from whetstone.contracts.enums import ModelStage
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.errors import ApiError
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters.store import ModelStore
from ..context import RegistryContext
from ..domain.merges import MergeState, merge_id_for, merged_in_artifact
from ..domain.stages import ModelRecord
from .downloads import MergedWeights, merged_download, owned
from .registration import owned_by


def merge_command(merge_id: str, model: ModelRecord) -> MergeRequestedV1:
    lineage = model.lineage
    return MergeRequestedV1(merge_id=merge_id, model_id=model.model_id, job_id=model.job_id,
                            artifact_uri=model.artifact_uri, manifest_sha256=model.artifact_sha256,
                            base_model=lineage.base_model if lineage else "",
                            base_model_sha256=lineage.base_model_sha256 if lineage else "")


async def request_merge(rt: Runtime[RegistryContext], tenant_id: str, model_id: str) -> MergedWeights:
    async with rt.uow() as uow:
        store = ModelStore(uow.conn)
        model = await owned(store, tenant_id, model_id)
        if model.stage == ModelStage.QUARANTINED:
            raise ApiError(409, f"model '{model_id}' is quarantined: no merged weights", code="model_quarantined")
        existing = await store.merge(model_id)
        if existing is not None and existing.status == MergeState.FAILED:
            # asked again after a failure (the adapter restored, the base back): a new merge, a new job
            merge_id = merge_id_for(model_id, existing.merge_id)
            if await store.retry_merge(model_id, existing.merge_id, merge_id):
                await uow.publish(merge_command(merge_id, model), tenant_id=tenant_id)
        elif existing is None:
            merged = merged_in_artifact(model.files)
            if merged:  # already produced by the training job: cached, nothing to bill
                await store.add_merge(merge_id_for(model_id), model_id, tenant_id, MergeState.SUCCEEDED,
                                      model.artifact_uri, model.artifact_sha256, merged)
            else:
                await store.add_merge(merge_id_for(model_id), model_id, tenant_id, MergeState.REQUESTED)
                await uow.publish(merge_command(merge_id_for(model_id), model), tenant_id=tenant_id)
    return await merged_download(rt, tenant_id, model_id)


async def merge_answered(rt: Runtime[RegistryContext], uow: UnitOfWork, tenant_id: str, ev: ModelMergedV1) -> None:
    store = ModelStore(uow.conn)
    model = await store.get(ev.model_id)
    if model is not None and model.tenant_id != tenant_id:
        raise PoisonMessage(f"merge answer for model {ev.model_id} names tenant {tenant_id!r}, not the model's own",
                            reason="tenant_mismatch")
    if ev.uri and not owned_by(ev.uri, tenant_id):
        raise PoisonMessage(f"merged weights of {ev.merge_id} ({ev.uri}) are not under tenant {tenant_id}'s prefix",
                            reason="tenant_mismatch")
    done = await store.complete_merge(ev.merge_id, MergeState(ev.status), ev.uri, ev.manifest_sha256, dict(ev.files),
                                      ev.merge_job_id, ev.error, tenant_id)
    if not done:
        rt.log.warning("merge answer for an unknown or finished merge", merge_id=ev.merge_id)
