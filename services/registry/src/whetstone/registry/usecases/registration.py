"""Registration: job spec + final checkpoint + eval verdict -> a lineage-complete model. Each input
is recorded as it arrives (in any order); the model is registered once all three are there."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from whetstone.contracts.enums import ModelStage
from whetstone.contracts import (
    CheckpointWrittenV1, EvalCompletedV1, JobQueuedV1, ModelRegisteredV1, fine_tuned_model_for,
)
from whetstone.runtime import fencing
from whetstone.runtime.chat_templates import TEMPLATE_FILES, chat_template_from
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.s3 import parse_uri, tenant_prefix
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.service import Runtime

from ..adapters.artifacts import ArtifactMissing
from ..adapters.store import ModelStore
from ..context import RegistryContext
from ..domain import lineage as lineage_rules
from ..domain import stages
from ..domain.lineage import FinalCheckpoint, IncompleteLineage, QueuedJob, build_lineage
from ..domain.stages import Transition
from . import promotion, tracking

SUMMARY_FILE = "whetstone_training.json"   # the trainer's summary: a vision adapter's image settings
SMALL_FILES = ("adapter_config.json", "environment.lock.json", SUMMARY_FILE) + TEMPLATE_FILES


def owned_by(uri: str, tenant_id: str) -> bool:
    try:
        return parse_uri(uri)[1].startswith(tenant_prefix(tenant_id))
    except ValueError:
        return False


async def job_queued(rt: Runtime[RegistryContext], uow: UnitOfWork, tenant_id: str, ev: JobQueuedV1) -> None:
    store = ModelStore(uow.conn)
    await store.record_job(QueuedJob(job_id=ev.job_id, tenant_id=tenant_id, spec=ev.spec, suffix=ev.suffix,
                                     job_template=ev.job_template, job_template_version=ev.job_template_version))
    await store.observe_base(ev.spec.base_model, ev.spec.base_model_sha256, ev.job_id)
    await register_if_ready(rt, uow, ev.job_id)


def _json_file(small: dict[str, bytes], name: str) -> dict[str, Any] | None:
    if name not in small:
        return None
    value = json.loads(small[name])
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not a JSON object")
    return value


async def final_checkpoint(rt: Runtime[RegistryContext], uow: UnitOfWork, tenant_id: str,
                           ev: CheckpointWrittenV1) -> None:
    """Final checkpoints only: read the manifest (per-file sha256) and the small files lineage needs.
    A fenced or superseded attempt's is refused (`stale_attempt`): no model is ever made of it."""
    if ev.kind != "final":
        return
    store = ModelStore(uow.conn)
    fenced = await fencing.fenced_attempt(uow.conn, ev.job_id, tenant_id)
    if fencing.cancelled(fenced):   # the node wrote it before it heard the cancel: no model is made of it
        rt.log.info("final checkpoint of a cancelled job not registered", job_id=ev.job_id, uri=ev.uri)
        return
    why = fencing.stale_reason(ev.job_id, ev.attempt, fenced, await store.final_attempt(ev.job_id))
    if why:
        raise PoisonMessage(f"final checkpoint {ev.uri} not registered: {why}", reason="stale_attempt")
    if not owned_by(ev.uri, tenant_id):
        raise PoisonMessage(f"final checkpoint of {ev.job_id} ({ev.uri}) is not under tenant {tenant_id}'s prefix")
    artifacts = rt.ctx.artifacts
    try:
        digest, manifest = await asyncio.to_thread(artifacts.read_manifest, ev.uri)
        small = await asyncio.to_thread(artifacts.read_optional, ev.uri, SMALL_FILES)
    except ArtifactMissing as exc:
        raise PoisonMessage(f"final checkpoint of {ev.job_id} has no manifest: {exc}") from exc
    if digest != ev.manifest_sha256:
        raise PoisonMessage(f"final checkpoint of {ev.job_id}: manifest.json sha256 {digest} is not the announced "
                            f"{ev.manifest_sha256}")
    try:
        checkpoint = FinalCheckpoint(
            job_id=ev.job_id, tenant_id=tenant_id, uri=ev.uri, manifest_sha256=ev.manifest_sha256, step=ev.step,
            segment_id=ev.segment_id, files=lineage_rules.file_manifest(manifest),
            chat_template_sha256=lineage_rules.chat_template_sha256(chat_template_from(small)),
            adapter_config=_json_file(small, "adapter_config.json"),
            environment=_json_file(small, "environment.lock.json"), attempt=ev.attempt,
            vision=lineage_rules.training_summary(small.get(SUMMARY_FILE)).vision)
    except (ValueError, TypeError) as exc:
        raise PoisonMessage(f"final checkpoint of {ev.job_id}: unreadable artifact metadata ({exc})") from exc
    await store.record_final_checkpoint(checkpoint)
    await register_if_ready(rt, uow, ev.job_id)


async def eval_completed(rt: Runtime[RegistryContext], uow: UnitOfWork, tenant_id: str, ev: EvalCompletedV1) -> None:
    await ModelStore(uow.conn).record_eval(tenant_id, ev)
    await register_if_ready(rt, uow, ev.job_id)


async def register_if_ready(rt: Runtime[RegistryContext], uow: UnitOfWork, job_id: str) -> None:
    store = ModelStore(uow.conn)
    job, ckpt, evaluation = await store.registration_parts(job_id)
    if not (job and ckpt and evaluation):
        return
    model_id = stages.model_id_for(job_id)
    if await store.get(model_id):
        return
    tenant = job.tenant_id
    if fencing.attempt_or_first(ckpt.attempt) <= await fencing.fenced_attempt(uow.conn, job_id, tenant):
        return   # nothing of a fenced attempt is registered
    if {ckpt.tenant_id or tenant, evaluation.tenant_id or tenant} != {tenant} or not owned_by(ckpt.uri, tenant):
        raise PoisonMessage(f"job {job_id} of tenant {tenant} got a checkpoint from {ckpt.tenant_id} and an eval"
                            f" from {evaluation.tenant_id}: not registered")
    environment = ckpt.environment or rt.ctx.environment
    try:
        record = build_lineage(job, ckpt, evaluation.event, environment)
    except IncompleteLineage as exc:
        raise PoisonMessage(str(exc)) from exc
    name = stages.model_name(record.base_model, tenant, job_id, job.suffix)
    public_id = fine_tuned_model_for(record.base_model, tenant, job.suffix, job_id)
    if await store.fine_tuned_model_taken(tenant, public_id, job_id):  # 48 bits of two job ids agreed
        public_id = fine_tuned_model_for(record.base_model, tenant, job.suffix, job_id, full_job_id=True)
    card = lineage_rules.model_card(model_id, name, tenant, record)
    artifacts = rt.ctx.artifacts
    # the export prefix sits next to the training artifact, whose files stay as the manifest lists them
    # (PEFT writes its own README.md there): model card, lockfile, adapter_config for serving
    export = artifacts.store.uri(f"tenants/{tenant}/models/{model_id}")
    card_uri = f"{export}/README.md"
    served_config = None if ckpt.adapter_config is None else lineage_rules.served_adapter_config(
        ckpt.adapter_config, record.base_model, lineage_rules.hub_revision(record.base_model, record.base_model_sha256))

    def write_side_files() -> None:  # deterministic content: a retried handler rewrites the same bytes
        artifacts.write(card_uri, card.encode(), "text/markdown")
        artifacts.write(f"{export}/environment.lock.json", json.dumps(environment, indent=1).encode(), "application/json")
        if served_config is not None:
            artifacts.write(f"{export}/adapter_config.json", json.dumps(served_config, indent=2).encode(),
                            "application/json")

    await asyncio.to_thread(write_side_files)
    wire = record.wire()
    if not await store.insert_model(model_id, job_id, tenant, name, ckpt.uri, ckpt.manifest_sha256, wire,
                                    record.files, public_id):
        return
    await store.insert_lineage(model_id, record, card_uri)
    await tracking.model_registered(rt, uow, job_id, model_id, public_id, card_uri, rt.clock())
    await store.apply(tenant, Transition(model_id, None, ModelStage.DEV, "registered"), None)
    await uow.publish(ModelRegisteredV1(model_id=model_id, name=name, fine_tuned_model=public_id, stage=ModelStage.DEV,
                                        artifact_uri=ckpt.uri, artifact_sha256=ckpt.manifest_sha256, lineage=wire,
                                        files=record.files, model_card_uri=card_uri), tenant_id=tenant)
    target = stages.stage_after_eval(record.eval_verdict)
    reason = f"eval {record.eval_verdict}: " + ("; ".join(record.eval_reasons) or "no reasons given")
    config = rt.ctx.config
    model = await promotion.promote(uow, store, model_id, tenant, target, reason, can_approve=False, actor=None,
                                    min_margin=config.auto_promote_min_margin)
    if model.stage == ModelStage.STAGING and config.auto_promote:
        verdict = await promotion.auto_policy(store, model, config.auto_promote_min_margin)
        if verdict.passed:
            await promotion.promote(uow, store, model_id, tenant, ModelStage.PRODUCTION,
                                    "auto-promotion at registration", can_approve=False, actor=None,
                                    min_margin=config.auto_promote_min_margin)
