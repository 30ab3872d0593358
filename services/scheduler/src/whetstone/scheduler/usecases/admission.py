"""Admission: a job request becomes a job (or a clear refusal), and a job waiting for its
training file's verdict moves to the queue. Records facts and wakes the scheduling loop; never
runs a scheduling cycle itself."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from whetstone.contracts import (
    CostEstimate, Event, Hyperparameters, JobRequestedV1, TrainingSpec, job_id_for,
)
from whetstone.contracts.enums import SpecMethod
from whetstone.runtime.models import UnknownModel
from whetstone.runtime.service import Runtime

from . import training_files
from ..adapters.catalog import BaseModelFacts
from . import rft
from ..adapters.store import JobStore
from ..context import SchedulerContext
from ..domain import admission as quotas
from ..domain import auto
from ..domain import jobs as rules
from ..domain import resources
from ..domain.cluster import PoolNode, describe_pool, describe_shapes
from ..domain.files import DatasetRecord, rejected_reasons
from ..domain.eval_bounds import check_eval_config
from ..domain.job import Job, new_job
from ..domain.job_data import JobRequest, JobResources, TemplateUse
from ..domain.placement import Node, Shape, could_ever_fit


class IdempotencyConflict(Exception):
    pass


class Rejected(Exception):
    def __init__(self, code: str, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.status, self.param = code, message, status, param


def month_of(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m")


def larger_than_pool(what: str, shapes: tuple[Shape, ...], nodes: list[Node], detail: str = "") -> Rejected:
    """The one wording of "no node of this pool can ever hold the job" (admission and the watcher)."""
    return Rejected("larger_than_pool", f"{what} ({describe_shapes(shapes)}); the pool's {len(nodes)} node(s) "
                                        f"({describe_pool(nodes)}) can never hold it" + detail)


def nodes_of(pool: list[PoolNode]) -> list[Node]:
    """The pool's nodes as placement sees them."""
    return [n.as_node() for n in pool]


async def pool_offers(ctx: SchedulerContext, store: JobStore) -> tuple[list[resources.GpuOffer], list[Node]]:
    """GPU types the pool (nodes not lost) and the catalog offer, and the pool's nodes."""
    pool = await store.pool_nodes()
    offers = resources.offers(((n.gpu_type, n.gpu_memory_gb, n.gpu_count) for n in pool),
                              ctx.config.cpu_memory_gb, include_catalog=True)
    return offers, nodes_of(pool)


def sees_images(model: BaseModelFacts) -> bool | None:
    """Whether the base model takes images (a vision config or an image processor); None when unknown (a Hub id)."""
    if model.config is None:
        return None
    return model.config.sees_images or (model.model.local and any(
        (Path(model.model.location) / name).is_file() for name in ("processor_config.json", "preprocessor_config.json")))


def images_refusal(vision: bool | None, image_rows: int, model: str, training_file: str) -> tuple[str, str] | None:
    """(code, message) when the training file has images and the base model cannot see them."""
    if not image_rows or vision is not False:
        return None
    return ("model_cannot_see_images", f"training file {training_file} has {image_rows} example(s) with images, but "
            f"base model {model!r} is text-only (no image processor); choose a vision-language base model "
            "(e.g. `whet models create-tiny --vision`, tiny-llava)")


async def plan_resources(ctx: SchedulerContext, store: JobStore, req: JobRequestedV1,
                         model: BaseModelFacts) -> JobResources:
    """The job's resource request ("auto" or the tenant's), checked against the pool; Rejected if it fits nowhere."""
    arch = resources.model_arch(req.model, model.config, model.weight_bytes)
    given = req.hyperparameters
    bad = rules.check_hyperparameters(req.method, given, arch.hidden_size, arch.max_positions)
    if bad:
        raise Rejected(bad.code, bad.message, param=bad.param or "hyperparameters")
    hp, _ = rules.resolve_hyperparameters(req.method, given, rules.model_defaults(arch.max_positions))
    offers, nodes = await pool_offers(ctx, store)
    plan = resources.plan_shapes(arch, req.method, hp, offers, ctx.config.cpu_max_params)
    size = f"{arch.params / 1e9:.2f}B-parameter" if arch.params >= 1e8 else f"{arch.params / 1e6:.2f}M-parameter"
    explicit = req.resources
    if explicit is None and arch.source == "unknown":
        raise Rejected("unknown_model_size", f"cannot tell the size of base model {req.model!r} (no sizes in its "
                       "config.json, no size in its name, no weight files): request resources explicitly", param="model")
    if explicit is not None:
        shape = Shape(resources.canonical_gpu_type(explicit.gpu_type), explicit.gpus_per_node, explicit.nodes)
        problem = resources.explicit_shape_problem(shape, plan.memory, offers)
        if problem:
            raise Rejected("resources_insufficient", f"requested resources cannot train this {size} model: {problem}",
                           param="resources")
        shapes: tuple[Shape, ...] = (shape,)
    else:
        shapes = plan.shapes
    if not shapes:
        reasons = "; ".join(f"{t}: {why}" for t, why in sorted(plan.refused.items())) or "no GPU type known"
        raise Rejected("fits_nowhere", f"a {req.method} job on this {size} model needs about "
                                       f"{plan.memory.total:.1f} GB and fits on no GPU type ({reasons})", param="model")
    if nodes:   # no node known yet (nothing heartbeated): keep every shape, capacity may come
        fitting = tuple(s for s in shapes if could_ever_fit(s, nodes))
        if not fitting:
            pool_types = {n.gpu_type for n in nodes}
            refused = "; ".join(f"{t}: {why}" for t, why in sorted(plan.refused.items()) if t in pool_types)
            raise larger_than_pool(f"a {req.method} job on this {size} model needs about {plan.memory.total:.1f} GB",
                                   shapes, nodes, f" ({refused})" if refused else "")
        shapes = fitting
    return JobResources.planned(explicit, shapes, plan.memory, arch, sees_images(model))


def pinned_base(model: BaseModelFacts, req: JobRequestedV1) -> BaseModelFacts:
    """The base as the request pins it (`base_model_sha256`, sent by `whet jobs reproduce`): a Hub base
    trains on the pinned commit whatever the repository's head is now (the trainer fetches that
    commit's snapshot); a catalog base must still hash to the pin, else the job is refused (409)."""
    pin = req.base_model_sha256
    if pin is None or pin == model.model.sha256:
        return model
    if model.model.local:
        raise Rejected("base_model_changed", f"base model {req.model!r} has changed since the pinned version: "
                       f"its weights are now sha256 {model.model.sha256[:12]}…, base_model_sha256 pins {pin[:12]}…", 409,
                       param="base_model_sha256")
    if len(pin) != 40:
        raise Rejected("invalid_value", f"base model {req.model!r} is a Hub model: base_model_sha256 pins it by its "
                       "40-hex commit", param="base_model_sha256")
    return replace(model, model=replace(model.model, sha256=pin))


async def submit_job(rt: Runtime[SchedulerContext], store: JobStore, tenant_id: str, req: JobRequestedV1,
                     trace_id: str | None = None, metadata: dict[str, str] | None = None,
                     template: TemplateUse | None = None) -> tuple[Job, bool]:
    """Create (or return the existing) job for this tenant's idempotency key (HTTP and Kafka alike).
    The job keeps one trace id for its whole life (the request's, or a new one).

    ``req.resources`` is an explicit {gpu_type, gpus_per_node, nodes} request; None means "auto"."""
    ctx = rt.ctx
    tier = rules.check_tenant(tenant_id, rt.settings.tenants, req.tier)
    if isinstance(tier, rules.Rejection):
        raise Rejected(tier.code, tier.message, 403, param="tier")
    if req.job_id != job_id_for(tenant_id, req.idempotency_key):
        raise Rejected("bad_job_id", "job_id must be job_id_for(tenant_id, idempotency_key)", param="job_id")
    if beyond := check_eval_config(req.eval_config, ctx.config.eval_bounds):
        raise Rejected("eval_config_out_of_bounds", beyond.message, param=beyond.param)
    request = JobRequest.of(req, metadata, template)
    fingerprint = rules.request_fingerprint(request)

    def replay(existing: Job) -> tuple[Job, bool]:
        if existing.tenant_id != tenant_id or existing.fingerprint != fingerprint:
            raise IdempotencyConflict(
                f"idempotency_key {req.idempotency_key!r} was already used for job {existing.job_id} "
                "with different parameters")
        return existing, False

    quota = ctx.config.quota_for(tenant_id, rt.settings.tenants[tenant_id])
    existing, seen = await store.peek(req.job_id, tenant_id, month_of(ctx.clock()))
    if existing:      # a retry: answered without the work below
        return replay(existing)
    # sizing the job reads files and the pool: done before the tenant's lock, which only covers the
    # quota check and the insert (the lock serialises one tenant's admissions)
    try:
        model = await ctx.models.resolve(req.model, rt.settings.model_catalog)
    except UnknownModel as exc:
        raise Rejected("unknown_base_model", str(exc), param="model") from exc
    model = pinned_base(model, req)
    planned = await plan_resources(ctx, store, req, model)
    dataset = await store.dataset(tenant_id, req.training_file)
    if dataset is not None and dataset.accepted and (mismatch := rules.check_method_fits_dataset(
            req.method, dataset.purpose, dataset.data_schema, req.training_file)):
        raise Rejected(mismatch.code, mismatch.message, param=mismatch.param)
    held_out = await store.dataset(tenant_id, req.validation_file) if req.validation_file else None
    if held_out is not None and held_out.accepted and (mismatch := rules.check_method_fits_dataset(
            req.method, held_out.purpose, held_out.data_schema, held_out.dataset_id, param="validation_file")):
        raise Rejected(mismatch.code, mismatch.message, param=mismatch.param)
    if dataset is not None and dataset.accepted and req.method in auto.METHODS and (
            few := auto.too_few_examples(req.hyperparameters, dataset.rows_kept)):
        raise Rejected(few.code, few.message, param=few.param)
    if dataset is not None and dataset.accepted and (blind := images_refusal(
            planned.arch.vision, dataset.image_rows, req.model, req.training_file)):
        raise Rejected(*blind, param="model")
    if refused := quotas.check_submission(quota, seen):   # at the cap already: no need to wait for the lock
        raise Rejected(refused.code, refused.message, 429)
    await store.lock_tenant(tenant_id)
    # read again under the tenant's lock (a statement after the lock sees every admission before it):
    # this is the answer that counts
    existing, usage = await store.peek(req.job_id, tenant_id, month_of(ctx.clock()))
    if existing:
        return replay(existing)
    if refused := quotas.check_submission(quota, usage):
        raise Rejected(refused.code, refused.message, 429)
    if unusable := await training_files.refusal(rt, store, tenant_id, req.training_file, dataset):
        raise Rejected(unusable.code, unusable.message, param=unusable.param)
    if req.validation_file and (unusable := await training_files.refusal(
            rt, store, tenant_id, req.validation_file, held_out, param="validation_file")):
        raise Rejected(unusable.code, unusable.message, param=unusable.param)
    job = new_job(req.job_id, tenant_id, fingerprint, request, tier, model.model.ref, model.model.sha256,
                  planned, ctx.clock(), trace_id or str(uuid.uuid4()))
    events = await queue_if_ready(rt, store, job, usage, dataset)
    await store.add(job)
    await store.publish(job, events)
    return job, True


async def try_queue(rt: Runtime[SchedulerContext], store: JobStore, job: Job) -> None:
    events = await queue_if_ready(rt, store, job)
    await store.save(job)
    await store.publish(job, events)


async def queue_if_ready(rt: Runtime[SchedulerContext], store: JobStore, job: Job,
                         usage: quotas.Usage | None = None, dataset: DatasetRecord | None = None) -> list[Event]:
    """Out of validating_files once the dataset's verdict is known (queued, or failed with the reason);
    the events to publish once the job is saved."""
    if job.status != rules.VALIDATING:
        return []
    ctx, req = rt.ctx, job.request
    ds = dataset if dataset is not None else await store.dataset(job.tenant_id, job.training_file)
    if ds is None:
        return []  # waits for dataset.validated
    now = ctx.clock()
    if not ds.accepted or ds.train_uri is None:
        return job.fail(now, "invalid_training_file", f"dataset {ds.dataset_id} was rejected: {rejected_reasons(ds.errors)}")
    if mismatch := rules.check_method_fits_dataset(job.method, ds.purpose, ds.data_schema, ds.dataset_id):
        return job.fail(now, mismatch.code, mismatch.message, param=mismatch.param)
    if blind := images_refusal(job.resources.arch.vision, ds.image_rows, job.base_model, ds.dataset_id):
        return job.fail(now, *blind, param="model")
    validation_uri = ds.validation_uri
    if req.validation_file:
        held_out = await validation_rows(store, job, req.validation_file)
        if held_out is None:
            return []  # waits for the validation file's dataset.validated
        if isinstance(held_out, rules.Rejection):
            return job.fail(now, held_out.code, held_out.message, param=held_out.param)
        validation_uri = held_out
    tuned = auto_hyperparameters(ctx, job, job.resources.model, ds)
    if isinstance(tuned, rules.Rejection):
        return job.fail(now, tuned.code, tuned.message, param=tuned.param)
    hp, hp_hash = tuned
    spec = TrainingSpec(
        base_model=job.base_model, base_model_sha256=job.base_model_sha256,
        dataset_id=ds.dataset_id, dataset_version=ds.version, train_uri=ds.train_uri,
        validation_uri=validation_uri, method=job.method, hyperparameters=hp.model_dump(exclude_none=True),
        hyperparameters_hash=hp_hash,
        eval_config=req.eval_config, reinforcement=req.reinforcement, image=req.image)
    runtime_s, gpu_hours = estimate_job(ctx, job, ds.tokens_total, hp, ds.rows_kept)
    queued = await enter_queue(rt, store, job, spec, runtime_s, gpu_hours, ds.cost_estimate or CostEstimate(), usage)
    if isinstance(queued, rules.Rejection):
        return job.fail(now, queued.code, queued.message)
    return queued


async def validation_rows(store: JobStore, job: Job, file_id: str) -> str | rules.Rejection | None:
    """The held-out rows of a job given a `validation_file`: that file's rows as ingest validated them
    (the same gate as the training file: for a reinforcement job, rft rows whose last message is the
    user's), used for validation during training and the eval gate's held-out stage instead of the
    training file's split. None while its verdict is unknown; a Rejection naming `validation_file`
    when it was rejected or holds data the method cannot use."""
    vds = await store.dataset(job.tenant_id, file_id)
    if vds is None:
        return None
    uri = vds.train_uri or vds.validation_uri   # a file uploaded alone is split by ingest: its kept rows
    if not vds.accepted or uri is None:
        return rules.Rejection("invalid_validation_file", f"validation_file {file_id} was rejected: "
                               f"{rejected_reasons(vds.errors)}", param="validation_file")
    return rules.check_method_fits_dataset(job.method, vds.purpose, vds.data_schema, file_id,
                                           param="validation_file") or uri


async def enter_queue(rt: Runtime[SchedulerContext], store: JobStore, job: Job, spec: TrainingSpec, runtime_s: float,
                      gpu_hours: float, cost: CostEstimate, usage: quotas.Usage | None = None
                      ) -> list[Event] | rules.Rejection:
    """The one way into the queue, for training and merge jobs alike: the estimate against the
    tenant's quota (over the hard cap: the Rejection; over the soft one: noted and flagged), the sort
    key from the tier's boost, `Job.queue` at its position, and the scheduling loop woken on commit."""
    ctx = rt.ctx
    now = ctx.clock()
    quota = ctx.config.quota_for(job.tenant_id, rt.settings.tenants.get(job.tenant_id, job.tier))
    usage = usage or await store.usage(job.tenant_id, month_of(now))
    verdict = quotas.check_estimate(quota, usage, gpu_hours)
    if isinstance(verdict, rules.Rejection):
        return verdict
    if verdict.over_soft:
        job.note(now, "over the soft monthly GPU-hour quota: overage is billed", level="warning",
                 **verdict.record().model_dump())
    sort_key = now.timestamp() - ctx.policy.tier(job.tier).boost_s
    estimate = cost.for_job(runtime_s, gpu_hours, verdict.over_soft)
    events = job.queue(now, spec, sort_key, runtime_s, verdict.record(),
                       await store.queue_position(sort_key, job.job_id), estimate)
    await store.wake_scheduler()
    return events


def auto_hyperparameters(ctx: SchedulerContext, job: Job, arch: resources.ModelArch,
                         ds: DatasetRecord) -> tuple[Hyperparameters, str] | rules.Rejection:
    """The job's hyperparameters: the user's values, "auto" ones chosen from the data and the model
    (domain/auto.py) for the platform's training methods, the method's defaults for the rest; and their hash."""
    given = job.request.hyperparameters
    hp, digest = rules.resolve_hyperparameters(job.method, given, rules.model_defaults(arch.max_positions))
    if job.method not in auto.METHODS:
        return hp, digest
    tuned = auto.resolve_for_job(job.method, given, hp, arch, job.shapes, ctx.config.cpu_memory_gb,
                                 auto.DataFacts(ds.rows_kept, ds.tokens_total))
    if isinstance(tuned, rules.Rejection):
        return tuned
    return tuned[0], rules.hyperparameters_hash(tuned[0])


def estimate_job(ctx: SchedulerContext, job: Job, tokens: int | None, hp: Hyperparameters,
                 rows: int | None = None) -> tuple[float, float]:
    """(runtime seconds, GPU-hours) on the job's preferred shape; a reinforcement job's tokens count
    its generations (rft.epoch_tokens)."""
    if job.method == SpecMethod.REINFORCEMENT:
        tokens = rft.epoch_tokens(tokens, rows, job.request.reinforcement)
    first = job.shapes[0]
    arch = job.resources.model
    gpu = resources.GPU_CATALOG.get(first.gpu_type)
    tflops = gpu.tflops if gpu else (resources.CPU_TFLOPS if first.gpu_type == resources.CPU else 100.0)
    runtime = resources.estimate_runtime_s(arch, job.method, tokens, int(hp.n_epochs or 1), first,
                                           tflops, ctx.config.default_runtime_s)
    return runtime, runtime * first.total / 3600.0
