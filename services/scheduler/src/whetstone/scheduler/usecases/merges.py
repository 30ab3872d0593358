"""Merge jobs: `model.merge_requested` (the registry, on POST /v1/models/{id}/merged) becomes a job
of the model's tenant with method `merge`, queued, placed and billed like any job: one device,
sized for the base model's weights, no training file to wait for. The trainer agent runs it and
answers `model.merged` itself.

Idempotent per merge id: the job id is `job_id_for(tenant, merge_id)`, so a redelivered command
or a second request finds the job it already made. A request naming another tenant's artifact or
training job is refused (dead letter); one the platform cannot run (unknown or changed base model,
quota, fits nowhere) is answered `model.merged` failed with the reason, without a job."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from whetstone.contracts import CostEstimate, Envelope, Hyperparameters, MergeRequestedV1, MergeSource, ModelMergedV1, TrainingSpec, job_id_for
from whetstone.contracts.enums import MergeStatus, SpecMethod
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.models import UnknownModel
from whetstone.runtime.s3 import parse_uri, tenant_prefix
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.service import Runtime

from ..adapters.catalog import BaseModelFacts
from ..adapters.store import JobStore
from .admission import enter_queue, month_of, nodes_of
from ..context import SchedulerContext
from ..domain import admission as quotas
from ..domain import jobs as rules
from ..domain import resources
from ..domain.job import new_job
from ..domain.job_data import JobRequest, JobResources
from ..domain.placement import Shape, could_ever_fit

Rt = Runtime[SchedulerContext]
NO_HYPERPARAMETERS_HASH = hashlib.sha256(b"{}").hexdigest()
MERGE_RUNTIME_S = 60.0            # load base + adapter, merge, save: minutes at most on a GPU
MERGE_SECONDS_PER_GB = 10.0       # plus reading and writing the weights


class MergeRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class MergePlan:
    resources: JobResources
    runtime_s: float


def owned_by(uri: str, tenant_id: str) -> bool:
    try:
        return parse_uri(uri)[1].startswith(tenant_prefix(tenant_id))
    except ValueError:
        return False


def merge_memory(arch: resources.ModelArch) -> resources.MemoryEstimate:
    """Base weights in fp32 (the merge happens in place) plus the per-device overhead: no
    gradients, no optimizer, no activations."""
    return resources.MemoryEstimate(4 * arch.params / resources.GB, 0.0, 0.0, 0.0, 0.0, resources.PER_GPU_OVERHEAD_GB)


async def plan_merge(ctx: SchedulerContext, store: JobStore, ref: str, model: BaseModelFacts) -> MergePlan:
    """One device of any type whose memory holds the base, cheapest first; MergeRefused if none."""
    arch = resources.model_arch(ref, model.config, model.weight_bytes)
    memory = merge_memory(arch)
    pool = await store.pool_nodes()
    nodes = nodes_of(pool)
    offers = resources.offers(((n.gpu_type, n.gpu_memory_gb, n.gpu_count) for n in pool),
                              ctx.config.cpu_memory_gb, include_catalog=True)
    fitting = sorted((o for o in offers if memory.total <= o.memory_gb * resources.USABLE_MEMORY),
                     key=lambda o: (o.price_per_hour, o.gpu_type))
    shapes = [Shape(o.gpu_type, 1, 1) for o in fitting]
    if nodes:   # no node known yet: keep every shape, capacity may come
        shapes = [s for s in shapes if could_ever_fit(s, nodes)]
    if not shapes:
        raise MergeRefused("fits_nowhere", f"merging needs about {memory.total:.1f} GB on one device; no device "
                                           "of the pool holds it")
    return MergePlan(JobResources.planned(None, tuple(shapes), memory, arch),
                     MERGE_RUNTIME_S + MERGE_SECONDS_PER_GB * memory.weights)


async def on_merge_requested(rt: Rt, uow: UnitOfWork, env: Envelope, ev: MergeRequestedV1) -> None:
    tenant = env.tenant_id
    if not owned_by(ev.artifact_uri, tenant):
        raise PoisonMessage(f"merge {ev.merge_id}: adapter {ev.artifact_uri} is not under tenant {tenant!r}'s prefix",
                            reason="tenant_mismatch")
    store = JobStore(uow)
    owner = await store.owner_of(ev.job_id)
    if owner is not None and owner != tenant:
        raise PoisonMessage(f"merge {ev.merge_id} names job {ev.job_id} of another tenant, not {tenant!r}",
                            reason="tenant_mismatch")
    job_id = job_id_for(tenant, ev.merge_id)
    if await store.get(job_id) is not None:
        rt.log.info("merge already has its job", merge_id=ev.merge_id, job_id=job_id)
        return
    try:
        await create_merge_job(rt, store, env, ev, job_id)
    except MergeRefused as exc:
        rt.ctx.metrics.rejected.labels(code=exc.code).inc()
        rt.log.warning("merge refused", merge_id=ev.merge_id, code=exc.code, reason=str(exc))
        await uow.publish(ModelMergedV1(merge_id=ev.merge_id, model_id=ev.model_id, status=MergeStatus.FAILED,
                                        error=f"{exc.code}: {exc}"), tenant_id=tenant, trace_id=env.trace_id)


async def create_merge_job(rt: Rt, store: JobStore, env: Envelope, ev: MergeRequestedV1, job_id: str) -> None:
    ctx, tenant = rt.ctx, env.tenant_id
    tier = rules.check_tenant(tenant, rt.settings.tenants, None)
    if isinstance(tier, rules.Rejection):
        raise MergeRefused(tier.code, tier.message)
    try:
        model = await ctx.models.resolve(ev.base_model, rt.settings.model_catalog)
    except UnknownModel as exc:
        raise MergeRefused("unknown_base_model", str(exc)) from exc
    if model.model.sha256 != ev.base_model_sha256:
        raise MergeRefused("base_model_changed", f"base model {ev.base_model} is now at sha256 "
                           f"{model.model.sha256[:12]}…; the adapter was trained on {ev.base_model_sha256[:12]}…")
    plan = await plan_merge(ctx, store, ev.base_model, model)
    await store.lock_tenant(tenant)
    if await store.get(job_id, lock=True) is not None:
        return
    now = ctx.clock()
    quota = ctx.config.quota_for(tenant, rt.settings.tenants[tenant])
    usage = await store.usage(tenant, month_of(now))
    if refused := quotas.check_submission(quota, usage):
        raise MergeRefused(refused.code, refused.message)
    source = MergeSource(merge_id=ev.merge_id, model_id=ev.model_id, adapter_uri=ev.artifact_uri,
                         adapter_manifest_sha256=ev.manifest_sha256, source_job_id=ev.job_id)
    # the job's request as the API shows it: its "training file" is the model whose adapter is merged
    request = JobRequest(job_id=job_id, idempotency_key=ev.merge_id, model=ev.base_model, training_file=ev.model_id,
                         method=SpecMethod.MERGE, hyperparameters=Hyperparameters(), merge=source,
                         metadata={"merge_id": ev.merge_id, "model_id": ev.model_id})
    fingerprint = rules.request_fingerprint(request)
    job = new_job(job_id, tenant, fingerprint, request, tier, model.model.ref, model.model.sha256,
                  plan.resources, now, env.trace_id or str(uuid.uuid4()))
    spec = TrainingSpec(base_model=job.base_model, base_model_sha256=job.base_model_sha256,
                        dataset_id=ev.model_id, dataset_version=ev.manifest_sha256, train_uri=ev.artifact_uri,
                        method=SpecMethod.MERGE, hyperparameters={}, hyperparameters_hash=NO_HYPERPARAMETERS_HASH,
                        merge=source)
    first = job.shapes[0]
    events = await enter_queue(rt, store, job, spec, plan.runtime_s, plan.runtime_s * first.total / 3600.0,
                               CostEstimate(merge_id=ev.merge_id), usage)
    if isinstance(events, rules.Rejection):
        raise MergeRefused(events.code, events.message)
    await store.add(job)
    await store.publish(job, events)
    rt.log.info("merge job queued", merge_id=ev.merge_id, job_id=job_id, model_id=ev.model_id,
                gpu_type=first.gpu_type, gpus=first.total)
