"""Applying stage-transition plans: rows, history and `model.promoted` events in one transaction."""

from __future__ import annotations

from whetstone.contracts.enums import Approval, ModelStage
from whetstone.contracts import ModelPromotedV1
from whetstone.runtime.messaging import UnitOfWork

from ..adapters.store import ModelStore
from ..domain import policy, stages
from ..domain.stages import ModelRecord, Plan, Transition


def promoted_event(model: ModelRecord, t: Transition, sequence: int, actor: str | None) -> ModelPromotedV1:
    lineage = model.lineage
    return ModelPromotedV1(
        model_id=model.model_id, from_stage=t.from_stage or "", to_stage=t.to_stage, reason=t.reason, name=model.name,
        fine_tuned_model=model.fine_tuned_model,
        artifact_uri=model.artifact_uri, artifact_sha256=model.artifact_sha256, files=model.files,
        base_model=lineage.base_model if lineage else None,
        base_model_sha256=lineage.base_model_sha256 if lineage else None,
        chat_template_sha256=lineage.chat_template_sha256 if lineage else None, approval=t.approval,
        approved_by=actor if t.approval == Approval.MANUAL else None, replaces_model_id=t.replaces_model_id,
        sequence=sequence)


async def apply_plan(uow: UnitOfWork, store: ModelStore, tenant_id: str, plan: Plan, actor: str | None) -> ModelRecord:
    """Every transition: model row + history row + event. Returns the main model afterwards."""
    model: ModelRecord | None = None
    for t in plan.transitions:
        sequence = await store.apply(tenant_id, t, actor)
        model = await store.get(t.model_id)
        assert model is not None
        await uow.publish(promoted_event(model, t, sequence, actor), tenant_id=tenant_id)
    assert model is not None
    return model


async def auto_policy(store: ModelStore, model: ModelRecord, min_margin: float) -> policy.PolicyResult:
    stored = await store.stored_lineage(model.model_id)
    if stored is None:
        return policy.auto_promotion(None, [], [], min_margin)
    lineage = stored.record
    return policy.auto_promotion(lineage.eval_verdict, lineage.eval_metrics, lineage.eval_stages, min_margin)


async def locked(store: ModelStore, model_id: str, tenant_id: str) -> ModelRecord:
    """The model, re-read under its (tenant, name) lock: stage changes of one name are serialised.
    LookupError when the tenant has no such model."""
    model = await store.get(model_id, tenant_id)
    if model is None:
        raise LookupError(model_id)
    await store.lock_name(tenant_id, model.name)
    model = await store.get(model_id, tenant_id)
    assert model is not None
    return model


async def promote(uow: UnitOfWork, store: ModelStore, model_id: str, tenant_id: str, target: ModelStage,
                  reason: str, *, can_approve: bool, actor: str | None, min_margin: float) -> ModelRecord:
    """Lock the name, re-read the model, let the domain decide, apply. Raises TransitionRefused."""
    model = await locked(store, model_id, tenant_id)
    current: ModelRecord | None = None
    approval: Approval | None = None
    if target == ModelStage.PRODUCTION:
        current = await store.production_of(tenant_id, model.name)
        if can_approve:
            approval = Approval.MANUAL
        else:
            verdict = await auto_policy(store, model, min_margin)
            approval = Approval.AUTO if verdict.passed else None
            if approval:
                reason = f"{reason} (auto-promotion: {verdict.reason})"
            elif model.stage == ModelStage.STAGING:
                raise stages.TransitionRefused(
                    "approval_required", "promotion to production needs a caller with the `models:promote` scope,"
                    f" or an eval that passes the auto-promotion policy: {verdict.reason}", 403)
    plan = stages.plan_promotion(model, target, reason, current_production=current, approval=approval)
    return await apply_plan(uow, store, tenant_id, plan, actor)


async def rollback(uow: UnitOfWork, store: ModelStore, model_id: str, tenant_id: str, reason: str,
                   actor: str | None) -> ModelRecord:
    model = await locked(store, model_id, tenant_id)
    previous = await store.previous_production(tenant_id, model.name, model.model_id)
    return await apply_plan(uow, store, tenant_id, stages.plan_rollback(model, previous, reason), actor)


async def archive(uow: UnitOfWork, store: ModelStore, model_id: str, tenant_id: str, reason: str,
                  actor: str | None, *, can_approve: bool) -> ModelRecord:
    model = await locked(store, model_id, tenant_id)
    return await apply_plan(uow, store, tenant_id, stages.plan_archive(model, reason, can_approve=can_approve), actor)
