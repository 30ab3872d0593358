"""Fences and cancels: what the registry does when the scheduler gives up on an attempt or a job is
cancelled. Nothing of a fenced attempt becomes a model; a cancelled job's model is withdrawn."""

from __future__ import annotations

from whetstone.contracts import JobCancelledV1, NodeFencedV1
from whetstone.runtime import fencing
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters.store import ModelStore
from ..context import RegistryContext
from ..domain import stages
from whetstone.contracts.enums import ModelStage
from . import promotion


async def attempt_fenced(rt: Runtime[RegistryContext], uow: UnitOfWork, tenant_id: str, ev: NodeFencedV1) -> None:
    """The scheduler gave up on an attempt: a final checkpoint of it that came first is dropped, so
    the verdict about it (whenever it comes) makes no model; the next attempt's will."""
    store = ModelStore(uow.conn)
    fenced = await fencing.record_fence(uow.conn, ev.job_id, tenant_id, ev.attempt)
    if await store.forget_fenced_checkpoint(ev.job_id, tenant_id, fenced):
        rt.log.warning("fenced attempt's final checkpoint dropped", job_id=ev.job_id, attempt=fenced)
    elif (model := await store.get(stages.model_id_for(ev.job_id))) is not None \
            and fencing.attempt_or_first(await store.final_attempt(ev.job_id)) <= fenced:
        rt.log.error("a model was registered from an attempt fenced afterwards; check it", job_id=ev.job_id,
                     model_id=model.model_id, attempt=fenced)


async def job_cancelled(rt: Runtime[RegistryContext], uow: UnitOfWork, tenant_id: str, ev: JobCancelledV1) -> None:
    """Cancel wins: the job is fenced whole (no checkpoint or verdict of it makes a model from now on)
    and its kept final checkpoint dropped. A model registered before the cancel got here (the cancel
    crossed the registration in flight) is withdrawn: a production version is rolled back to the
    previous one of its name (archived when there is none), any other stage archived, so serving
    unloads it. A gang's cancel names each node: the first one does it, the others find it done."""
    store = ModelStore(uow.conn)
    fenced = await fencing.record_fence(uow.conn, ev.job_id, tenant_id, fencing.CANCELLED)
    if await store.forget_fenced_checkpoint(ev.job_id, tenant_id, fenced):
        rt.log.info("cancelled job's final checkpoint dropped", job_id=ev.job_id)
    model = await store.get(stages.model_id_for(ev.job_id), tenant_id)
    if model is None or model.stage == ModelStage.ARCHIVED:
        return
    reason = f"job {ev.job_id} was cancelled: its model is withdrawn"
    rt.log.warning("model of a cancelled job withdrawn", job_id=ev.job_id, model_id=model.model_id, stage=model.stage)
    if model.stage == ModelStage.PRODUCTION:
        try:
            await promotion.rollback(uow, store, model.model_id, tenant_id, reason, None)
            return
        except stages.TransitionRefused:
            pass
    await promotion.archive(uow, store, model.model_id, tenant_id, reason, None, can_approve=True)
