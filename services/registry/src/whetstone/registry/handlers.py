"""Registry: job spec + final checkpoint + eval verdict -> a lineage-complete model; re-eval answers;
merge answers. One function per event: parse -> domain -> unit of work."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from whetstone.contracts import (
    CheckpointWrittenV1, Envelope, EvalCompletedV1, JobQueuedV1, Lineage, Metric, ModelMergedV1, ModelRegisteredV1,
    NodeFencedV1, fine_tuned_model_for,
)
from whetstone.contracts import JobCancelledV1
from whetstone.runtime import fencing
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.s3 import parse_uri, tenant_prefix
from whetstone.runtime.service import PoisonMessage, Runtime

from . import promotion
from .adapters.artifacts import ArtifactMissing
from .adapters.store import ModelStore
from .context import RegistryContext
from .domain import lineage as lineage_rules
from .domain import stages
from .domain.lineage import IncompleteLineage, LineageRecord

SMALL_FILES = ("adapter_config.json", "environment.lock.json") + lineage_rules.CHAT_TEMPLATE_FILES
NO_TEMPLATE = "the job was not created from a job template"


def owned_by(uri: str, tenant_id: str) -> bool:
    try:
        return parse_uri(uri)[1].startswith(tenant_prefix(tenant_id))
    except ValueError:
        return False


async def on_job_queued(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: JobQueuedV1) -> None:
    store = ModelStore(uow.conn)
    await store.record_job(ev.job_id, env.tenant_id, ev.spec.model_dump(mode="json"), ev.suffix, ev.job_template,
                           ev.job_template_version)
    await store.observe_base(ev.spec.base_model, ev.spec.base_model_sha256, ev.job_id)
    await register_if_ready(rt, uow, ev.job_id)


async def on_checkpoint_written(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope,
                                ev: CheckpointWrittenV1) -> None:
    """Final checkpoints only: read the manifest (per-file sha256) and the small files lineage needs.
    A fenced or superseded attempt's is refused (`stale_attempt`): no model is ever made of it."""
    if ev.kind != "final":
        return
    store = ModelStore(uow.conn)
    fenced = await fencing.fenced_attempt(uow.conn, ev.job_id, env.tenant_id)
    if fencing.cancelled(fenced):   # the node wrote it before it heard the cancel: no model is made of it
        rt.log.info("final checkpoint of a cancelled job not registered", job_id=ev.job_id, uri=ev.uri)
        return
    why = fencing.stale_reason(ev.job_id, ev.attempt, fenced, await store.final_attempt(ev.job_id))
    if why:
        raise PoisonMessage(f"final checkpoint {ev.uri} not registered: {why}", reason="stale_attempt")
    if not owned_by(ev.uri, env.tenant_id):
        raise PoisonMessage(f"final checkpoint of {ev.job_id} ({ev.uri}) is not under tenant {env.tenant_id}'s prefix")
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
        files = lineage_rules.file_manifest(manifest)
        adapter_config = json.loads(small["adapter_config.json"]) if "adapter_config.json" in small else None
        environment = json.loads(small["environment.lock.json"]) if "environment.lock.json" in small else None
        template = lineage_rules.chat_template_from(small)
    except (ValueError, KeyError, TypeError) as exc:
        raise PoisonMessage(f"final checkpoint of {ev.job_id}: unreadable artifact metadata ({exc})") from exc
    await store.record_final_checkpoint(
        ev.job_id, env.tenant_id, ev.uri, ev.manifest_sha256, ev.step, ev.segment_id, files,
        lineage_rules.chat_template_sha256(template), adapter_config, environment, ev.attempt)
    await register_if_ready(rt, uow, ev.job_id)


async def on_node_fenced(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: NodeFencedV1) -> None:
    """The scheduler gave up on an attempt: a final checkpoint of it that came first is dropped, so
    the verdict about it (whenever it comes) makes no model; the next attempt's will."""
    store = ModelStore(uow.conn)
    fenced = await fencing.record_fence(uow.conn, ev.job_id, env.tenant_id, ev.attempt)
    if await store.forget_fenced_checkpoint(ev.job_id, env.tenant_id, fenced):
        rt.log.warning("fenced attempt's final checkpoint dropped", job_id=ev.job_id, attempt=fenced)
    elif (model := await store.get(stages.model_id_for(ev.job_id))) is not None \
            and (await store.final_attempt(ev.job_id) or 1) <= fenced:
        rt.log.error("a model was registered from an attempt fenced afterwards; check it", job_id=ev.job_id,
                     model_id=model.model_id, attempt=fenced)


async def on_job_cancelled(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: JobCancelledV1) -> None:
    """Cancel wins: the job is fenced whole (no checkpoint or verdict of it makes a model from now on)
    and its kept final checkpoint dropped. A model registered before the cancel got here (the cancel
    crossed the registration in flight) is withdrawn: a production version is rolled back to the
    previous one of its name (archived when there is none), any other stage archived, so serving
    unloads it. A gang's cancel names each node: the first one does it, the others find it done."""
    store = ModelStore(uow.conn)
    fenced = await fencing.record_fence(uow.conn, ev.job_id, env.tenant_id, fencing.CANCELLED)
    if await store.forget_fenced_checkpoint(ev.job_id, env.tenant_id, fenced):
        rt.log.info("cancelled job's final checkpoint dropped", job_id=ev.job_id)
    model = await store.get(stages.model_id_for(ev.job_id), env.tenant_id)
    if model is None or model.stage == "archived":
        return
    reason = f"job {ev.job_id} was cancelled: its model is withdrawn"
    rt.log.warning("model of a cancelled job withdrawn", job_id=ev.job_id, model_id=model.model_id, stage=model.stage)
    if model.stage == "production":
        try:
            await promotion.rollback(uow, store, model.model_id, env.tenant_id, reason, None)
            return
        except stages.TransitionRefused:
            pass
    await promotion.archive(uow, store, model.model_id, env.tenant_id, reason, None, can_approve=True)


async def on_eval_completed(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: EvalCompletedV1) -> None:
    store = ModelStore(uow.conn)
    if ev.request_id:
        await on_reeval_completed(rt, store, ev)
        return
    await store.record_eval(ev.job_id, env.tenant_id, ev.verdict, ev.model_dump(mode="json"))
    await register_if_ready(rt, uow, ev.job_id)


async def on_reeval_completed(rt: Runtime[RegistryContext], store: ModelStore, ev: EvalCompletedV1) -> None:
    request = await store.reeval(ev.request_id or "")
    if request is None or request["status"] != "requested":
        rt.log.warning("eval answer for an unknown or finished re-evaluation", request_id=ev.request_id)
        return
    base = await store.base(request["base_model"])
    still_current = bool(base and base["sha256"] == request["base_model_sha256"])
    await store.complete_reeval(request["request_id"], request["model_id"], ev.verdict, list(ev.reasons), still_current)


async def on_model_merged(rt: Runtime[RegistryContext], uow: UnitOfWork, env: Envelope, ev: ModelMergedV1) -> None:
    model = await ModelStore(uow.conn).get(ev.model_id)
    if model is not None and model.tenant_id != env.tenant_id:
        raise PoisonMessage(f"merge answer for model {ev.model_id} names tenant {env.tenant_id!r}, not the model's own",
                            reason="tenant_mismatch")
    if ev.uri and not owned_by(ev.uri, env.tenant_id):
        raise PoisonMessage(f"merged weights of {ev.merge_id} ({ev.uri}) are not under tenant {env.tenant_id}'s prefix",
                            reason="tenant_mismatch")
    done = await ModelStore(uow.conn).complete_merge(ev.merge_id, ev.status, ev.uri, ev.manifest_sha256, dict(ev.files),
                                                     ev.merge_job_id, ev.error, env.tenant_id)
    if not done:
        rt.log.warning("merge answer for an unknown or finished merge", merge_id=ev.merge_id)


def build_lineage(job: Any, ckpt: Any, evaluation: dict[str, Any], environment: dict[str, Any]) -> LineageRecord:
    spec = job["spec"]
    template, version = job["job_template"], job["job_template_version"]
    return LineageRecord(
        job_id=job["job_id"], base_model=spec["base_model"], base_model_sha256=spec["base_model_sha256"],
        dataset_id=spec["dataset_id"], dataset_version=spec["dataset_version"], method=spec["method"],
        hyperparameters=spec["hyperparameters"], hyperparameters_hash=spec["hyperparameters_hash"],
        training_run=ckpt["segment_id"] or f"{job['job_id']}:final", checkpoint_step=ckpt["step"],
        job_template=template, job_template_version=version,
        job_template_missing_reason=None if template and version else NO_TEMPLATE,
        environment=environment, environment_sha256=lineage_rules.environment_sha256(environment),
        eval_verdict=evaluation["verdict"], eval_metrics=evaluation["metrics"],
        eval_stages=evaluation.get("stages") or [], eval_reasons=evaluation.get("reasons") or [],
        files=ckpt["files"], chat_template_sha256=ckpt["chat_template_sha256"])


async def register_if_ready(rt: Runtime[RegistryContext], uow: UnitOfWork, job_id: str) -> None:
    store = ModelStore(uow.conn)
    job, ckpt, ev = await store.registration_parts(job_id)
    if not (job and ckpt and ev):
        return
    model_id = stages.model_id_for(job_id)
    if await store.get(model_id):
        return
    tenant = job["tenant_id"]
    if (ckpt["attempt"] or 1) <= await fencing.fenced_attempt(uow.conn, job_id, tenant):
        return   # nothing of a fenced attempt is registered
    if {ckpt["tenant_id"] or tenant, ev["tenant_id"] or tenant} != {tenant} or not owned_by(ckpt["uri"], tenant):
        raise PoisonMessage(f"job {job_id} of tenant {tenant} got a checkpoint from {ckpt['tenant_id']} and an eval"
                            f" from {ev['tenant_id']}: not registered")
    environment = ckpt["environment"] or rt.ctx.environment
    try:
        record = build_lineage(job, ckpt, ev["event"], environment)
    except IncompleteLineage as exc:
        raise PoisonMessage(str(exc)) from exc
    name = stages.model_name(record.base_model, tenant, job_id, job["suffix"])
    public_id = fine_tuned_model_for(record.base_model, tenant, job["suffix"], job_id)
    if await store.fine_tuned_model_taken(tenant, public_id, job_id):  # 48 bits of two job ids agreed
        public_id = fine_tuned_model_for(record.base_model, tenant, job["suffix"], job_id, full_job_id=True)
    card = lineage_rules.model_card(model_id, name, tenant, record)
    artifacts = rt.ctx.artifacts
    # the export prefix sits next to the training artifact, whose files stay as the manifest lists them
    # (PEFT writes its own README.md there): model card, lockfile, adapter_config for serving
    export = artifacts.store.uri(f"tenants/{tenant}/models/{model_id}")
    card_uri = f"{export}/README.md"
    served_config = lineage_rules.served_adapter_config(
        ckpt["adapter_config"], record.base_model,
        lineage_rules.hub_revision(record.base_model, record.base_model_sha256)) \
        if ckpt["adapter_config"] is not None else None

    def write_side_files() -> None:  # deterministic content: a retried handler rewrites the same bytes
        artifacts.write(card_uri, card.encode(), "text/markdown")
        artifacts.write(f"{export}/environment.lock.json", json.dumps(environment, indent=1).encode(), "application/json")
        if served_config is not None:
            artifacts.write(f"{export}/adapter_config.json", json.dumps(served_config, indent=2).encode(),
                            "application/json")

    await asyncio.to_thread(write_side_files)
    wire = Lineage(job_id=job_id, base_model=record.base_model, base_model_sha256=record.base_model_sha256,
                   dataset_id=record.dataset_id, dataset_version=record.dataset_version, method=record.method,
                   hyperparameters_hash=record.hyperparameters_hash, eval_verdict=record.eval_verdict,
                   eval_metrics=[Metric.model_validate(m) for m in record.eval_metrics],
                   eval_stages=record.eval_stages, training_run=record.training_run,
                   checkpoint_step=record.checkpoint_step, job_template=record.job_template,
                   job_template_version=record.job_template_version,
                   chat_template_sha256=record.chat_template_sha256, environment_sha256=record.environment_sha256)
    lineage_json = wire.model_dump(mode="json")
    if not await store.insert_model(model_id, job_id, tenant, name, ckpt["uri"], ckpt["manifest_sha256"], lineage_json,
                                    record.files, public_id):
        return
    await store.insert_lineage(model_id, record, card_uri)
    await store.apply(tenant, stages.Transition(model_id, "", "dev", "registered"), None)
    await uow.publish(ModelRegisteredV1(model_id=model_id, name=name, fine_tuned_model=public_id, stage="dev",
                                        artifact_uri=ckpt["uri"],
                                        artifact_sha256=ckpt["manifest_sha256"], lineage=wire, files=record.files,
                                        model_card_uri=card_uri), tenant_id=tenant)
    target = stages.stage_after_eval(record.eval_verdict)
    reason = f"eval {record.eval_verdict}: " + ("; ".join(record.eval_reasons) or "no reasons given")
    model = await promotion.promote(uow, store, model_id, tenant, target, reason, can_approve=False, actor=None,
                                    min_margin=rt.ctx.config.auto_promote_min_margin)
    if model.stage == "staging" and rt.ctx.config.auto_promote:
        verdict = await promotion.auto_policy(store, model, rt.ctx.config.auto_promote_min_margin)
        if verdict.passed:
            await promotion.promote(uow, store, model_id, tenant, "production", "auto-promotion at registration",
                                    can_approve=False, actor=None, min_margin=rt.ctx.config.auto_promote_min_margin)
