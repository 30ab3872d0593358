"""Scheduler handlers: parse -> domain -> unit of work (state + outbox).

The policy lives in `domain.policy.cycle` (pure); `dispatch` loads a snapshot from
Postgres, runs one cycle and applies its decisions in the same transaction."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from whetstone.contracts import (
    CheckpointRef, CheckpointWrittenV1, DatasetSubmittedV1, DatasetValidatedV1, Envelope, EvalCompletedV1,
    JobAssignedV1, JobCancelledV1, JobCompletedV1, JobFailedV1, JobPreemptedV1, JobPreemptRequestedV1,
    JobProgressV1, JobQueuedV1,
    JobRequestedV1, JobStartedV1, NodeHeartbeatV1, Resources, TrainingSpec, UsageMeteredV1, job_id_for,
)
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.models import UnknownModel, resolve_model
from whetstone.runtime.service import PoisonMessage, Runtime

from .adapters.catalog import model_facts
from .adapters.metrics import SchedulerMetrics
from .adapters.snapshot import ClusterView, load_cluster, pick_gpu_ids, progress_fraction, shapes_of
from .config import SchedulerSettings
from .domain import admission as A
from .domain import jobs as J
from .domain import resources as R
from .domain.placement import Node, Shape, could_ever_fit, rendezvous
from .domain.policy import Assignment, Forecast, Policy, cycle, forecast

DISPATCH_LOCK = 42
TIERS = ("premium", "standard", "free")


class IdempotencyConflict(Exception):
    pass


class Rejected(Exception):
    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


def config(rt: Runtime) -> SchedulerSettings:
    return rt.state["config"]


def metrics(rt: Runtime) -> SchedulerMetrics:
    if "metrics" not in rt.state:
        rt.state["metrics"] = SchedulerMetrics(rt.metrics.registry)
    return rt.state["metrics"]


def policy(rt: Runtime) -> Policy:
    if "policy" not in rt.state:
        rt.state["policy"] = config(rt).policy()
    return rt.state["policy"]


async def log_job_event(uow: UnitOfWork, job_id: str, now: datetime, message: str, level: str = "info",
                        **data: Any) -> None:
    await uow.conn.execute(
        "INSERT INTO job_events (job_id, created_at, level, message, data) VALUES ($1, $2, $3, $4, $5)",
        job_id, now, level, message, data)


async def get_job(uow: UnitOfWork, job_id: str, *, lock: bool = False) -> dict | None:
    row = await uow.conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1" + (" FOR UPDATE" if lock else ""), job_id)
    return dict(row) if row else None


async def set_status(rt: Runtime, uow: UnitOfWork, job: dict, target: str, message: str, **fields: Any) -> bool:
    """Apply a state-machine transition; False (and nothing changed) when it is not allowed."""
    if not J.can_transition(job["status"], target):
        rt.log.info("transition ignored", job_id=job["job_id"], current=job["status"], target=target)
        return False
    now = rt.clock()
    sets = {"status": target, "updated_at": now, **fields}
    if target in J.TERMINAL:
        sets.setdefault("finished_at", now)
    await update_job(uow, job, **sets)
    await log_job_event(uow, job["job_id"], now, message, status=target)
    return True


async def update_job(uow: UnitOfWork, job: dict, **sets: Any) -> None:
    cols = ", ".join(f"{k} = ${i}" for i, k in enumerate(sets, start=2))
    await uow.conn.execute(f"UPDATE jobs SET {cols} WHERE job_id = $1", job["job_id"], *sets.values())
    job.update(sets)


OFF_NODE = {"node_id": None, "gpu_ids": [], "placement": [], "node_ids": []}


async def fail_job(rt: Runtime, uow: UnitOfWork, job: dict, code: str, message: str, error_class: str = "user") -> None:
    if await set_status(rt, uow, job, J.FAILED, message, **OFF_NODE,
                        error={"code": code, "message": message, "error_class": error_class}):
        await uow.publish(JobFailedV1(job_id=job["job_id"], error_class=error_class, code=code, message=message),
                          tenant_id=job["tenant_id"], trace_id=job["trace_id"])


# --------------------------------------------------------------- admission


def month_of(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m")


async def lock_tenant(uow: UnitOfWork, tenant_id: str) -> None:
    """Serialise one tenant's admissions: the in-flight count and usage read below stay true until commit."""
    await uow.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('tenant:' || $1, 0))", tenant_id)


async def tenant_usage(rt: Runtime, uow: UnitOfWork, tenant_id: str) -> A.Usage:
    seconds = await uow.conn.fetchval("SELECT gpu_seconds FROM tenant_usage WHERE tenant_id = $1 AND month = $2",
                                      tenant_id, month_of(rt.clock()))
    in_flight = await uow.conn.fetchval(
        "SELECT count(*) FROM jobs WHERE tenant_id = $1 AND status <> ALL($2::text[])", tenant_id, sorted(J.TERMINAL))
    return A.Usage((seconds or 0.0) / 3600.0, in_flight)


async def pool_offers(rt: Runtime, uow: UnitOfWork) -> tuple[list[R.GpuOffer], list[Node]]:
    """GPU types the pool (nodes not lost) and the catalog offer, and the pool's nodes."""
    rows = await uow.conn.fetch(
        "SELECT node_id, gpu_type, gpu_count, gpu_memory_gb, spot, interconnect_group FROM nodes WHERE NOT lost")
    nodes = [Node(r["node_id"], R.canonical_gpu_type(r["gpu_type"]), r["gpu_count"], r["gpu_count"], r["spot"],
                  r["interconnect_group"]) for r in rows]
    offers = R.offers(((r["gpu_type"], r["gpu_memory_gb"], r["gpu_count"]) for r in rows),
                      config(rt).cpu_memory_gb, include_catalog=True)
    return offers, nodes


async def plan_resources(rt: Runtime, uow: UnitOfWork, req: JobRequestedV1, model: Any,
                         explicit: dict[str, Any] | None) -> dict[str, Any]:
    """The job's resource request ("auto" or the tenant's), checked against the pool; Rejected if it fits nowhere."""
    cfg = config(rt)
    model_config, weight_bytes = await asyncio.to_thread(model_facts, model)
    arch = R.model_arch(req.model, model_config, weight_bytes)
    given = req.hyperparameters.model_dump(exclude_none=True)
    bad = J.check_hyperparameters(req.method, given, arch.hidden_size, arch.max_positions)
    if bad:
        raise Rejected(bad.code, bad.message)
    hp, _ = J.resolve_hyperparameters(req.method, given)
    offers, nodes = await pool_offers(rt, uow)
    plan = R.plan_shapes(arch, req.method, hp, offers, cfg.cpu_max_params)
    size = f"{arch.params / 1e9:.2f}B-parameter" if arch.params >= 1e8 else f"{arch.params / 1e6:.2f}M-parameter"
    if explicit is None and arch.source == "unknown":
        raise Rejected("unknown_model_size", f"cannot tell the size of base model {req.model!r} (no sizes in its "
                       "config.json, no size in its name, no weight files): request resources explicitly")
    if explicit is not None:
        shape = Shape(R.canonical_gpu_type(explicit["gpu_type"]), explicit["gpus_per_node"], explicit.get("nodes", 1))
        problem = R.explicit_shape_problem(shape, plan.memory, offers)
        if problem:
            raise Rejected("resources_insufficient", f"requested resources cannot train this {size} model: {problem}")
        shapes: tuple[Shape, ...] = (shape,)
    else:
        shapes = plan.shapes
    if not shapes:
        reasons = "; ".join(f"{t}: {why}" for t, why in sorted(plan.refused.items())) or "no GPU type known"
        raise Rejected("fits_nowhere", f"a {req.method} job on this {size} model needs about "
                                       f"{plan.memory.total:.1f} GB and fits on no GPU type ({reasons})")
    if nodes:   # no node known yet (nothing heartbeated): keep every shape, capacity may come
        fitting = tuple(s for s in shapes if could_ever_fit(s, nodes))
        if not fitting:
            pool = ", ".join(sorted({f"{n.gpu_count}x {n.gpu_type}" for n in nodes}))
            wanted = ", ".join(f"{s.nodes}x{s.gpus_per_node} {s.gpu_type}" for s in shapes[:4])
            pool_types = {n.gpu_type for n in nodes}
            refused = "; ".join(f"{t}: {why}" for t, why in sorted(plan.refused.items()) if t in pool_types)
            raise Rejected("larger_than_pool",
                           f"a {req.method} job on this {size} model needs about {plan.memory.total:.1f} GB "
                           f"({wanted}); the pool's {len(nodes)} node(s) ({pool}) can never hold it"
                           + (f" ({refused})" if refused else ""))
        shapes = fitting
    return {"request": explicit or "auto", "shapes": [s.as_dict() for s in shapes],
            "memory_gb": plan.memory.as_dict(), "params": arch.params, "params_source": arch.source,
            "arch": {"hidden_size": arch.hidden_size, "num_layers": arch.num_layers, "vocab_size": arch.vocab_size,
                     "max_positions": arch.max_positions}}


async def submit_job(rt: Runtime, uow: UnitOfWork, tenant_id: str, req: JobRequestedV1,
                     trace_id: str | None = None) -> tuple[dict, bool]:
    """Create (or return the existing) job for this tenant's idempotency key (HTTP and Kafka alike).
    The job keeps one trace id for its whole life (the request's, or a new one): every event the
    scheduler publishes about it carries it, whatever event triggered the publish.

    ``req.resources`` is an explicit {gpu_type, gpus_per_node, nodes} request; None means "auto"."""
    tier = J.check_tenant(tenant_id, rt.settings.tenants, req.tier)
    if isinstance(tier, J.Rejection):
        raise Rejected(tier.code, tier.message, 403)
    if req.job_id != job_id_for(tenant_id, req.idempotency_key):
        raise Rejected("bad_job_id", "job_id must be job_id_for(tenant_id, idempotency_key)")
    request = req.model_dump(mode="json", exclude={"job_id"})
    resources = request.pop("resources")
    if resources is not None:
        request["resources"] = resources
    fingerprint = J.request_fingerprint(request)
    await lock_tenant(uow, tenant_id)
    existing = await get_job(uow, req.job_id, lock=True)
    if existing is not None:
        if existing["tenant_id"] != tenant_id or existing["fingerprint"] != fingerprint:
            raise IdempotencyConflict(
                f"idempotency_key {req.idempotency_key!r} was already used for job {existing['job_id']} "
                "with different parameters")
        return existing, False
    cfg = config(rt)
    quota = cfg.quota_for(tenant_id, rt.settings.tenants[tenant_id])
    refused = A.check_submission(quota, await tenant_usage(rt, uow, tenant_id))
    if refused:
        raise Rejected(refused.code, refused.message, 429)
    try:
        model = await asyncio.to_thread(resolve_model, req.model, rt.settings.model_catalog)
    except UnknownModel as exc:
        raise Rejected("unknown_base_model", str(exc)) from exc
    planned = await plan_resources(rt, uow, req, model, resources)
    now = rt.clock()
    await uow.conn.execute(
        "INSERT INTO jobs (job_id, tenant_id, idempotency_key, fingerprint, request, status, tier, priority,"
        " spec, resources, created_at, updated_at, trace_id) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$11,$12)",
        req.job_id, tenant_id, req.idempotency_key, fingerprint, request, J.VALIDATING, tier,
        J.TIER_PRIORITY[tier], {"base_model": model.ref, "base_model_sha256": model.sha256}, planned, now,
        trace_id or str(uuid.uuid4()))
    job = await get_job(uow, req.job_id, lock=True)
    assert job is not None
    shapes = ", ".join(f"{s['nodes']}x{s['gpus_per_node']} {s['gpu_type']}" for s in planned["shapes"][:3])
    await log_job_event(uow, job["job_id"], now, f"job created; needs about {planned['memory_gb']['total']:.1f} GB:"
                        f" {shapes}", model=req.model, training_file=req.training_file, resources=planned)
    await try_queue(rt, uow, job)
    return job, True


async def try_queue(rt: Runtime, uow: UnitOfWork, job: dict) -> None:
    """Move a job out of validating_files once its dataset's verdict is known."""
    if job["status"] != J.VALIDATING:
        return
    req = job["request"]
    ds = await uow.conn.fetchrow("SELECT * FROM datasets WHERE tenant_id = $1 AND dataset_id = $2",
                                 job["tenant_id"], req["training_file"])
    if ds is None:
        return  # waits for dataset.validated
    if ds["status"] != "accepted":
        reasons = "; ".join(f"line {e.get('line')}: {e['message']}" if e.get("line") else e["message"]
                            for e in ds["errors"][:5])
        await fail_job(rt, uow, job, "invalid_training_file", f"dataset {ds['dataset_id']} was rejected: {reasons}")
        return
    mismatch = J.check_method_fits_dataset(req["method"], ds["purpose"])
    if mismatch:
        await fail_job(rt, uow, job, mismatch.code, mismatch.message)
        return
    hp, hp_hash = J.resolve_hyperparameters(req["method"], req.get("hyperparameters") or {})
    spec = TrainingSpec(
        base_model=job["spec"]["base_model"], base_model_sha256=job["spec"]["base_model_sha256"],
        dataset_id=ds["dataset_id"], dataset_version=ds["version"], train_uri=ds["train_uri"],
        validation_uri=ds["validation_uri"], method=req["method"], hyperparameters=hp, hyperparameters_hash=hp_hash)
    resources = job["resources"]
    runtime_s, gpu_hours = estimate_job(rt, job, ds["tokens_total"], hp)
    quota = config(rt).quota_for(job["tenant_id"], rt.settings.tenants.get(job["tenant_id"], job["tier"]))
    verdict = A.check_estimate(quota, await tenant_usage(rt, uow, job["tenant_id"]), gpu_hours)
    if isinstance(verdict, J.Rejection):
        await fail_job(rt, uow, job, verdict.code, verdict.message)
        return
    if verdict.over_soft:
        await log_job_event(uow, job["job_id"], rt.clock(), "over the soft monthly GPU-hour quota: overage is "
                            "billed", level="warning", **verdict.as_dict())
    now = rt.clock()
    first = shapes_of(resources)[0]
    await set_status(rt, uow, job, J.QUEUED, "job queued", spec=spec.model_dump(mode="json"), queued_at=now,
                     sort_key=now.timestamp() - policy(rt).tier(job["tier"]).boost_s,
                     estimated_runtime_s=runtime_s, quota=verdict.as_dict())
    position = await queue_position(uow, job)
    cost = {**(ds["cost_estimate"] or {}), "estimated_runtime_s": round(runtime_s, 1),
            "estimated_gpu_hours": round(gpu_hours, 4), **({"over_soft_quota": True} if verdict.over_soft else {})}
    await uow.publish(JobQueuedV1(job_id=job["job_id"], tier=job["tier"], spec=spec,
                                  resources=Resources(gpu_type=first.gpu_type, gpus_per_node=first.gpus_per_node,
                                                      nodes=first.nodes),
                                  queue_position=position, cost_estimate=cost), tenant_id=job["tenant_id"], trace_id=job["trace_id"])
    await dispatch(rt, uow)


def estimate_job(rt: Runtime, job: dict, tokens: int | None, hp: dict[str, Any]) -> tuple[float, float]:
    """(runtime seconds, GPU-hours) on the job's preferred shape."""
    res = job["resources"]
    first = shapes_of(res)[0]
    a = res.get("arch") or {}
    arch = R.ModelArch(res.get("params", 0), res.get("params_source", "unknown"), a.get("hidden_size"),
                       a.get("num_layers"), a.get("vocab_size"), a.get("max_positions"))
    gpu = R.GPU_CATALOG.get(first.gpu_type)
    tflops = gpu.tflops if gpu else (R.CPU_TFLOPS if first.gpu_type == R.CPU else 100.0)
    runtime = R.estimate_runtime_s(arch, job["request"]["method"], tokens, int(hp.get("n_epochs") or 1), first,
                                   tflops, config(rt).default_runtime_s)
    return runtime, runtime * first.total / 3600.0


async def queue_position(uow: UnitOfWork, job: dict) -> int:
    return await uow.conn.fetchval(
        "SELECT count(*) FROM jobs WHERE status = 'queued' AND (sort_key, job_id) <= ($1, $2)",
        job["sort_key"], job["job_id"])


async def on_job_requested(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobRequestedV1) -> None:
    try:
        await submit_job(rt, uow, env.tenant_id, ev, env.trace_id)
    except Rejected as exc:
        metrics(rt).rejected.labels(code=exc.code).inc()
        await uow.publish(JobFailedV1(job_id=ev.job_id, error_class="user", code=exc.code, message=exc.message),
                          tenant_id=env.tenant_id)
    except IdempotencyConflict as exc:
        raise PoisonMessage(str(exc)) from exc


async def on_dataset_submitted(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: DatasetSubmittedV1) -> None:
    """Remember that the dataset exists (validation pending), so a job naming it waits instead of failing."""
    await uow.conn.execute(
        "INSERT INTO dataset_submissions (tenant_id, dataset_id, submitted_at) VALUES ($1, $2, $3)"
        " ON CONFLICT DO NOTHING", env.tenant_id, ev.dataset_id, env.occurred_at)


async def on_dataset_validated(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: DatasetValidatedV1) -> None:
    await uow.conn.execute(
        "INSERT INTO datasets (tenant_id, dataset_id, version, status, purpose, train_uri, validation_uri,"
        " rows_kept, tokens_total, errors, cost_estimate) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11)"
        " ON CONFLICT (tenant_id, dataset_id) DO UPDATE SET version = EXCLUDED.version, status = EXCLUDED.status,"
        " purpose = EXCLUDED.purpose, train_uri = EXCLUDED.train_uri, validation_uri = EXCLUDED.validation_uri,"
        " rows_kept = EXCLUDED.rows_kept, tokens_total = EXCLUDED.tokens_total, errors = EXCLUDED.errors,"
        " cost_estimate = EXCLUDED.cost_estimate",
        env.tenant_id, ev.dataset_id, ev.version, ev.status, ev.purpose, ev.train_uri, ev.validation_uri,
        ev.rows_kept, ev.tokens_total, [e.model_dump(mode="json") for e in ev.errors], ev.cost_estimate)
    waiting = await uow.conn.fetch(
        "SELECT job_id FROM jobs WHERE tenant_id = $1 AND status = $2 AND request->>'training_file' = $3"
        " ORDER BY created_at FOR UPDATE", env.tenant_id, J.VALIDATING, ev.dataset_id)
    for row in waiting:
        job = await get_job(uow, row["job_id"])
        assert job is not None
        await try_queue(rt, uow, job)


# ---------------------------------------------------------------- scheduling


async def dispatch(rt: Runtime, uow: UnitOfWork) -> int:
    """One scheduling cycle: snapshot -> `domain.policy.cycle` -> assignments and preemption requests."""
    cfg, m = config(rt), metrics(rt)
    began = time.perf_counter()
    await uow.conn.execute("SELECT pg_advisory_xact_lock($1)", DISPATCH_LOCK)  # one cycle at a time
    view = await load_cluster(uow.conn, rt.clock(), cfg.node_timeout, cfg.queue_scan, cfg.checkpoint_s)
    observe_queue(m, view)
    if not view.snapshot.queue:
        return 0
    result = cycle(view.snapshot, policy(rt))
    for p in result.preemptions:
        await request_preemption(rt, uow, p.job_id, "priority",
                                 f"preempted for higher-priority job {p.for_job_id}", p.for_job_id)
    placed = 0
    for a in result.assignments:
        if await assign(rt, uow, view, a):
            placed += 1
            m.assigned.labels(how="backfill" if a.backfilled else "in_order").inc()
    m.decisions.inc(result.decisions)
    m.cycle_seconds.observe(time.perf_counter() - began)
    return placed


def observe_queue(m: SchedulerMetrics, view: ClusterView) -> None:
    now = view.snapshot.now
    for tier in TIERS:
        waiting = [now - j.queued_at for j in view.snapshot.queue if j.tier == tier]
        m.queue_depth.labels(tier=tier).set(len(waiting))
        m.oldest_wait.labels(tier=tier).set(max(waiting, default=0.0))


async def assign(rt: Runtime, uow: UnitOfWork, view: ClusterView, a: Assignment) -> bool:
    job = await get_job(uow, a.job_id, lock=True)
    if job is None or job["status"] != J.QUEUED:
        return False
    now = rt.clock()
    placement = [{"node_id": n, "gpu_ids": pick_gpu_ids(n, g, view)} for n, g in a.placement.nodes]
    attempt = job["attempt"] + 1
    segment_id = f"{job['job_id']}-s{attempt}"
    remaining = (job["estimated_runtime_s"] or config(rt).default_runtime_s) * (1 - progress_fraction(job["progress"]))
    shape = a.placement.shape
    where = ", ".join(f"{p['node_id']} GPUs {p['gpu_ids']}" for p in placement)
    await set_status(rt, uow, job, J.PROVISIONING, f"assigned to {where}" + (" (backfilled)" if a.backfilled else ""),
                     node_id=placement[0]["node_id"], gpu_ids=placement[0]["gpu_ids"], placement=placement,
                     node_ids=[p["node_id"] for p in placement], attempt=attempt, segment_id=segment_id,
                     segment_started_at=now, est_end_at=now + timedelta(seconds=remaining), last_checkpoint_at=None,
                     resources={**job["resources"], "assigned": {**shape.as_dict(), "spot": a.placement.spot}})
    ckpt = job["latest_checkpoint"]
    spec = TrainingSpec.model_validate(job["spec"])
    resume = CheckpointRef(**{k: ckpt[k] for k in ("uri", "step", "manifest_sha256")}) if ckpt else None
    node_ids = [p["node_id"] for p in placement]
    rows = await uow.conn.fetch("SELECT node_id, address FROM nodes WHERE node_id = ANY($1)", node_ids)
    meeting = rendezvous(node_ids, {r["node_id"]: r["address"] for r in rows})
    for p, rdzv in zip(placement, meeting, strict=True):   # a gang: every node gets its part of the same segment
        await uow.publish(JobAssignedV1(job_id=job["job_id"], node_id=p["node_id"], segment_id=segment_id,
                                        attempt=attempt, gpu_ids=p["gpu_ids"], spec=spec, resume_from=resume,
                                        rendezvous=rdzv), tenant_id=job["tenant_id"], trace_id=job["trace_id"])
    return True


async def request_preemption(rt: Runtime, uow: UnitOfWork, job_id: str, reason: str, message: str,
                             for_job: str | None = None) -> bool:
    """Tell the job's node(s) to checkpoint and stop (job.preempt_requested); the agent's own
    job.preempted (emergency checkpoint on SIGTERM) then re-queues it. Meanwhile the cycle counts
    its GPUs as freeing soon."""
    row = await uow.conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1 FOR UPDATE SKIP LOCKED", job_id)
    if row is None:
        return False   # busy in another transaction: the next cycle decides again
    job = dict(row)
    if job["status"] not in J.ACTIVE_ON_NODE or job["preempt_requested_at"] is not None:
        return False
    now = rt.clock()
    await update_job(uow, job, preempt_requested_at=now, preempt_reason=reason, preempted_for=for_job, updated_at=now)
    await log_job_event(uow, job_id, now, f"{message}: checkpoint and stop requested; the job resumes from its "
                        "checkpoint when capacity frees", level="warning", reason=reason, for_job=for_job)
    command_reason = reason if reason in ("priority", "spot_loss", "drain") else "priority"
    for node_id in job["node_ids"] or []:
        await uow.publish(JobPreemptRequestedV1(job_id=job_id, node_id=node_id, segment_id=job["segment_id"],
                                                reason=command_reason, for_job_id=for_job), tenant_id=job["tenant_id"], trace_id=job["trace_id"])
    rt.log.warning("preemption requested", job_id=job_id, reason=reason, for_job=for_job, nodes=job["node_ids"])
    metrics(rt).preemptions.labels(reason=reason).inc()
    return True


async def on_node_heartbeat(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: NodeHeartbeatV1) -> None:
    await uow.conn.execute(
        "INSERT INTO nodes (node_id, gpu_type, gpu_count, gpu_memory_gb, spot, interconnect_group, last_seen, lost,"
        " address) VALUES ($1,$2,$3,$4,$5,$6,$7,false,$8) ON CONFLICT (node_id) DO UPDATE SET"
        " gpu_type = EXCLUDED.gpu_type, address = coalesce(EXCLUDED.address, nodes.address),"
        " gpu_count = EXCLUDED.gpu_count, gpu_memory_gb = EXCLUDED.gpu_memory_gb, spot = EXCLUDED.spot,"
        " interconnect_group = EXCLUDED.interconnect_group,"
        " last_seen = greatest(nodes.last_seen, EXCLUDED.last_seen), lost = false",
        ev.node_id, ev.gpu_type, ev.gpu_count, ev.gpu_memory_gb, ev.spot, ev.interconnect_group, ev.sent_at,
        ev.address)
    if await uow.conn.fetchval("SELECT 1 FROM jobs WHERE status = 'queued' LIMIT 1"):
        await dispatch(rt, uow)


async def scheduling_loop(rt: Runtime) -> None:
    """Cycles also run on a timer: waits age, wait targets come due, reservations start."""
    while True:
        await asyncio.sleep(config(rt).cycle_interval_s)
        async with rt.uow() as uow:
            if await uow.conn.fetchval("SELECT 1 FROM jobs WHERE status = 'queued' LIMIT 1"):
                await dispatch(rt, uow)


# -------------------------------------------------------------- lifecycle


async def _current(rt: Runtime, uow: UnitOfWork, job_id: str, segment_id: str | None) -> dict | None:
    """The job, if this event belongs to its current segment (stale segments are ignored)."""
    job = await get_job(uow, job_id, lock=True)
    if job is None:
        rt.log.warning("event for unknown job", job_id=job_id)
        return None
    if segment_id is not None and job["segment_id"] != segment_id:
        rt.log.info("event of an old segment ignored", job_id=job_id, segment_id=segment_id)
        return None
    return job


async def on_job_started(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobStartedV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job:
        await set_status(rt, uow, job, J.RUNNING, f"training started on {ev.node_id}"
                         + (f", resumed from step {ev.resumed_from_step}" if ev.resumed_from_step else ""),
                         started_at=job["started_at"] or ev.started_at,
                         progress={**job["progress"], "total_steps": ev.total_steps})


async def on_job_progress(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobProgressV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job and job["status"] in J.ACTIVE_ON_NODE and ev.step >= job["progress"].get("step", -1):
        progress = {k: v for k, v in ev.model_dump().items() if k not in ("job_id", "segment_id") and v is not None}
        await uow.conn.execute("UPDATE jobs SET progress = $2, updated_at = $3 WHERE job_id = $1",
                               ev.job_id, progress, rt.clock())
        if job["status"] == J.PROVISIONING:
            await set_status(rt, uow, job, J.RUNNING, "training running")


async def on_checkpoint_written(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: CheckpointWrittenV1) -> None:
    job = await get_job(uow, ev.job_id, lock=True)
    if job is None:
        return
    latest = job["latest_checkpoint"] or {}
    if ev.step >= latest.get("step", -1):
        await uow.conn.execute(
            "UPDATE jobs SET latest_checkpoint = $2,"
            " last_checkpoint_at = CASE WHEN segment_id = $3 THEN $4 ELSE last_checkpoint_at END WHERE job_id = $1",
            ev.job_id, {"uri": ev.uri, "step": ev.step, "manifest_sha256": ev.manifest_sha256, "kind": ev.kind},
            ev.segment_id, ev.written_at)
    await log_job_event(uow, ev.job_id, rt.clock(), f"{ev.kind} checkpoint at step {ev.step}", uri=ev.uri)


async def on_job_preempted(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobPreemptedV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job is None:
        return
    if ev.checkpoint:
        latest = job["latest_checkpoint"] or {}
        if ev.checkpoint.step >= latest.get("step", -1):
            job["latest_checkpoint"] = {**ev.checkpoint.model_dump(), "kind": "emergency"}
    on_spot = bool((job["resources"] or {}).get("assigned", {}).get("spot"))
    counts: dict[str, int] = {}
    if ev.reason == "spot_loss" or (on_spot and ev.reason in ("node_lost", "drain", "signal")):
        counts["spot_preemptions"] = job["spot_preemptions"] + 1
    if ev.reason == "priority" or job["preempt_reason"] == "priority":
        counts["priority_preemptions"] = job["priority_preemptions"] + 1
    if await set_status(rt, uow, job, J.PREEMPTED, f"preempted ({ev.reason})", **OFF_NODE, **counts,
                        latest_checkpoint=job["latest_checkpoint"], preempt_requested_at=None, preempt_reason=None,
                        preempted_for=None):
        await requeue(rt, uow, job)


async def requeue(rt: Runtime, uow: UnitOfWork, job: dict) -> None:
    """A preempted job always goes back to the queue: same job_id, same queue time (priority kept),
    resuming from its latest checkpoint."""
    await set_status(rt, uow, job, J.QUEUED, "re-queued; resumes from its latest checkpoint" if
                     job["latest_checkpoint"] else "re-queued; no checkpoint yet, restarts from the beginning")
    first = shapes_of(job["resources"])[0]
    await uow.publish(JobQueuedV1(job_id=job["job_id"], tier=job["tier"], spec=TrainingSpec.model_validate(job["spec"]),
                                  resources=Resources(gpu_type=first.gpu_type, gpus_per_node=first.gpus_per_node,
                                                      nodes=first.nodes),
                                  queue_position=await queue_position(uow, job), requeued=True),
                      tenant_id=job["tenant_id"], trace_id=job["trace_id"])
    await dispatch(rt, uow)


async def on_job_completed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobCompletedV1) -> None:
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job:
        await set_status(rt, uow, job, J.EVALUATING, f"training finished after {ev.steps} steps; evaluating",
                         trained_tokens=ev.tokens, **OFF_NODE,
                         latest_checkpoint={**ev.final_checkpoint.model_dump(), "kind": "final"})
        await dispatch(rt, uow)


async def on_job_failed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: JobFailedV1) -> None:
    """A failed job (NaN loss, bad data, crash) is terminal: never re-queued automatically."""
    job = await _current(rt, uow, ev.job_id, ev.segment_id)
    if job and job["status"] not in J.TERMINAL:
        await set_status(rt, uow, job, J.FAILED, ev.message, **OFF_NODE,
                         error={"code": ev.code, "message": ev.message, "error_class": ev.error_class})
        await dispatch(rt, uow)


async def on_eval_completed(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: EvalCompletedV1) -> None:
    job = await get_job(uow, ev.job_id, lock=True)
    if job:
        await set_status(rt, uow, job, J.SUCCEEDED, f"evaluation {ev.verdict}: {'; '.join(ev.reasons)}",
                         eval=ev.model_dump(mode="json"))


# ------------------------------------------------------------ commands


async def cancel_job(rt: Runtime, uow: UnitOfWork, job: dict) -> bool:
    nodes = job["node_ids"] or ([job["node_id"]] if job["node_id"] else [])
    if not await set_status(rt, uow, job, J.CANCELLED, "cancelled by user", **OFF_NODE):
        return False
    for node in nodes or [None]:
        await uow.publish(JobCancelledV1(job_id=job["job_id"], node_id=node), tenant_id=job["tenant_id"], trace_id=job["trace_id"])
    if nodes:
        await dispatch(rt, uow)
    return True


# ------------------------------------------------------------- watchers


async def watch_lost_nodes(rt: Runtime) -> None:
    """Nodes silent past the timeout are lost: their jobs are preempted and re-queued."""
    cfg = config(rt)
    while True:
        await asyncio.sleep(cfg.lost_node_check_s)
        async with rt.uow() as uow:
            lost = await uow.conn.fetch(
                "UPDATE nodes SET lost = true WHERE NOT lost AND last_seen < $1 RETURNING node_id",
                rt.clock() - cfg.node_timeout)
            for node in lost:
                jobs = await preempt_jobs_on_node(rt, uow, node["node_id"], "node_lost")
                rt.log.warning("node lost", node_id=node["node_id"], jobs=jobs)


async def preempt_jobs_on_node(rt: Runtime, uow: UnitOfWork, node_id: str, reason: str) -> list[str]:
    """The node is gone: report its jobs preempted from their last checkpoint (the scheduler's
    own job.preempted), which re-queues them."""
    rows = await uow.conn.fetch("SELECT job_id FROM jobs WHERE $1 = ANY(node_ids) AND status = ANY($2::text[])",
                                node_id, sorted(J.ACTIVE_ON_NODE))
    for r in rows:
        job = await get_job(uow, r["job_id"], lock=True)
        assert job is not None
        ckpt = job["latest_checkpoint"]
        await uow.publish(JobPreemptedV1(
            job_id=job["job_id"], segment_id=job["segment_id"], node_id=node_id, reason=reason, stopped_at=rt.clock(),
            checkpoint=CheckpointRef(**{k: ckpt[k] for k in ("uri", "step", "manifest_sha256")}) if ckpt else None),
            tenant_id=job["tenant_id"], trace_id=job["trace_id"])
    return [r["job_id"] for r in rows]


async def on_usage_metered(rt: Runtime, uow: UnitOfWork, env: Envelope, ev: UsageMeteredV1) -> None:
    """Quota accounting arrives as events, never by reading metering's tables. Segment events
    (a job's segments as they end, and later corrections) add to the month as they come; the job
    total counts the job, and its GPU-seconds only where no segment event was seen."""
    owner = await uow.conn.fetchval("SELECT tenant_id FROM jobs WHERE job_id = $1", ev.job_id)
    if owner is not None and owner != env.tenant_id:
        raise PoisonMessage(f"usage.metered for job {ev.job_id} names tenant {env.tenant_id!r}, not the job's own")
    key = "job" if ev.scope == "job" else f"segment:{ev.segment_id or ''}"
    if not await uow.conn.fetchval("INSERT INTO usage_seen (job_id, key) VALUES ($1, $2)"
                                   " ON CONFLICT DO NOTHING RETURNING true", ev.job_id, key):
        return
    row = await uow.conn.fetchrow(
        "INSERT INTO job_usage (job_id, tenant_id) VALUES ($1, $2) ON CONFLICT (job_id)"
        " DO UPDATE SET job_id = EXCLUDED.job_id RETURNING *", ev.job_id, env.tenant_id)
    if row["tenant_id"] != env.tenant_id:
        raise PoisonMessage(f"usage.metered for job {ev.job_id} names tenant {env.tenant_id!r},"
                            f" but the job's usage belongs to {row['tenant_id']!r}")
    before = A.JobUsage(row["segments"], row["segment_seconds"], row["segment_cost"], row["total_seconds"],
                        row["total_cost"])
    after = (before.with_total(ev.billable_gpu_seconds, ev.cost) if ev.scope == "job"
             else before.with_segment(ev.billable_gpu_seconds, ev.cost))
    await uow.conn.execute(
        "UPDATE job_usage SET segments = $2, segment_seconds = $3, segment_cost = $4, total_seconds = $5,"
        " total_cost = $6 WHERE job_id = $1", ev.job_id, after.segments, after.segment_seconds, after.segment_cost,
        after.total_seconds, after.total_cost)
    seconds, cost = A.usage_delta(before, after)
    await uow.conn.execute(
        "INSERT INTO tenant_usage (tenant_id, month, jobs, gpu_seconds, cost) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT (tenant_id, month) DO UPDATE SET jobs = tenant_usage.jobs + EXCLUDED.jobs,"
        " gpu_seconds = tenant_usage.gpu_seconds + EXCLUDED.gpu_seconds, cost = tenant_usage.cost + EXCLUDED.cost",
        env.tenant_id, month_of(env.occurred_at), int(ev.scope == "job"), seconds, cost)


async def expire_waiting_jobs(rt: Runtime) -> None:
    """A job whose training file never gets validated fails with a clear reason instead of hanging:
    quickly when nobody ever submitted that dataset, after ``dataset_wait_s`` when validation stalls."""
    cfg = config(rt)
    while True:
        await asyncio.sleep(min(2.0, cfg.unknown_dataset_grace_s / 2, cfg.dataset_wait_s / 2))
        async with rt.uow() as uow:
            now = rt.clock()
            rows = await uow.conn.fetch(
                "SELECT j.job_id, EXISTS (SELECT 1 FROM dataset_submissions s WHERE s.tenant_id = j.tenant_id"
                "  AND s.dataset_id = j.request->>'training_file') AS submitted FROM jobs j"
                " WHERE j.status = $1 AND j.created_at < $2 FOR UPDATE SKIP LOCKED",
                J.VALIDATING, now - timedelta(seconds=cfg.unknown_dataset_grace_s))
            for r in rows:
                job = await get_job(uow, r["job_id"])
                assert job is not None
                name = job["request"]["training_file"]
                if not r["submitted"]:
                    await fail_job(rt, uow, job, "unknown_training_file",
                                   f"training_file {name!r} is not a dataset this tenant uploaded: upload it first "
                                   "(whet datasets upload) and use the dataset id it prints")
                elif job["created_at"] < now - timedelta(seconds=cfg.dataset_wait_s):
                    await fail_job(rt, uow, job, "training_file_not_validated",
                                   f"training_file {name!r} was uploaded but not validated within "
                                   f"{cfg.dataset_wait_s:.0f}s; try again later")
            await fail_unplaceable(rt, uow)


async def fail_unplaceable(rt: Runtime, uow: UnitOfWork) -> None:
    """A job admitted before any node was known, which no node of the pool can ever hold, fails
    (after a grace for nodes still joining) instead of waiting forever."""
    cfg = config(rt)
    _, nodes = await pool_offers(rt, uow)
    if not nodes:
        return
    rows = await uow.conn.fetch(
        "SELECT job_id, resources FROM jobs WHERE status = 'queued' AND queued_at < $1 FOR UPDATE SKIP LOCKED",
        rt.clock() - timedelta(seconds=cfg.unplaceable_grace_s))
    for r in rows:
        shapes = shapes_of(r["resources"])
        if any(could_ever_fit(s, nodes) for s in shapes):
            continue
        job = await get_job(uow, r["job_id"])
        assert job is not None
        pool = ", ".join(sorted({f"{n.gpu_count}x {n.gpu_type}" for n in nodes}))
        wanted = ", ".join(f"{s.nodes}x{s.gpus_per_node} {s.gpu_type}" for s in shapes[:4])
        await fail_job(rt, uow, job, "larger_than_pool", f"the job needs {wanted} and no node of the pool "
                       f"({pool}) can ever hold it", error_class="user")


# -------------------------------------------------------------- job view


async def queue_forecasts(rt: Runtime, uow: UnitOfWork) -> dict[str, Forecast]:
    """Queue position and estimated start of every queued job (start only for the first forecast_limit)."""
    cfg = config(rt)
    view = await load_cluster(uow.conn, rt.clock(), cfg.node_timeout, cfg.queue_scan, cfg.checkpoint_s)
    return forecast(view.snapshot, policy(rt), cfg.forecast_limit)


# ------------------------------------------------------------ kubernetes


async def apply_node_change(rt: Runtime, uow: UnitOfWork, kind: str, node: Any) -> None:
    """One node from the Kubernetes inventory: upsert it; a deleted node is lost; a cordoned or
    spot-interruption-tainted node gets no new work and its jobs are told to checkpoint and stop."""
    if kind == "DELETED":
        await uow.conn.execute("UPDATE nodes SET lost = true, schedulable = false, unschedulable_reason = 'deleted'"
                               " WHERE node_id = $1", node.node_id)
        await preempt_jobs_on_node(rt, uow, node.node_id, "spot_loss" if node.spot else "node_lost")
        return
    await uow.conn.execute(
        "INSERT INTO nodes (node_id, gpu_type, gpu_count, gpu_memory_gb, spot, interconnect_group, last_seen, lost,"
        " schedulable, unschedulable_reason, source) VALUES ($1,$2,$3,$4,$5,$6,$7,false,$8,$9,'k8s')"
        " ON CONFLICT (node_id) DO UPDATE SET gpu_type = EXCLUDED.gpu_type, gpu_count = EXCLUDED.gpu_count,"
        " gpu_memory_gb = EXCLUDED.gpu_memory_gb, spot = EXCLUDED.spot,"
        " interconnect_group = EXCLUDED.interconnect_group, schedulable = EXCLUDED.schedulable,"
        " unschedulable_reason = EXCLUDED.unschedulable_reason",
        node.node_id, node.gpu_type, node.gpu_count, node.gpu_memory_gb, node.spot, node.interconnect_group,
        rt.clock(), node.schedulable, node.unschedulable_reason)
    if node.unschedulable_reason in ("spot_loss", "drain"):
        rows = await uow.conn.fetch("SELECT job_id FROM jobs WHERE $1 = ANY(node_ids) AND status = ANY($2::text[])",
                                    node.node_id, sorted(J.ACTIVE_ON_NODE))
        what = "spot interruption notice" if node.unschedulable_reason == "spot_loss" else "node drain"
        for r in rows:
            await request_preemption(rt, uow, r["job_id"], node.unschedulable_reason,
                                     f"{what} on node {node.node_id}")


async def sync_kubernetes(rt: Runtime) -> None:
    """List GPU nodes, then watch them; relist when the watch expires or its resourceVersion is too old."""
    from .adapters.k8s_inventory import KubernetesInventory, connect  # noqa: PLC0415

    cfg = config(rt)
    inventory = KubernetesInventory(await connect(cfg.k8s_host), cfg.k8s_label_selector)
    while True:
        nodes = await inventory.list_nodes()
        async with rt.uow() as uow:
            for node in nodes:
                await apply_node_change(rt, uow, "ADDED", node)
        rt.log.info("kubernetes inventory listed", nodes=len(nodes), resource_version=inventory.resource_version)
        try:
            async for change in inventory.watch(timeout_seconds=300):
                async with rt.uow() as uow:
                    await apply_node_change(rt, uow, change.kind, change.node)
        except Exception as exc:  # 410 Gone, connection reset: relist after a pause
            rt.log.warning("kubernetes watch ended; relisting", error=str(exc))
            await asyncio.sleep(1.0)
