"""Scheduler handlers: one per event, each load -> domain -> save -> publish in the message's unit
of work. A handler that frees capacity or queues a job wakes the scheduling loop (on commit);
none runs a scheduling cycle itself."""

from __future__ import annotations

from whetstone.contracts import (
    CheckpointWrittenV1, DatasetSubmittedV1, DatasetValidatedV1, Envelope, EvalCompletedV1, JobCompletedV1,
    JobFailedV1, JobPreemptedV1, JobProgressV1, JobRequestedV1, JobStartedV1, ModelRegisteredV1, NodeHeartbeatV1,
    UsageMeteredV1,
)
from whetstone.runtime.identity import PLATFORM_TENANT   # nodes belong to the platform
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.s3 import within_tenant
from whetstone.runtime.service import PoisonMessage, Runtime

from ..usecases.admission import IdempotencyConflict, Rejected, month_of, submit_job, try_queue
from ..adapters.metrics import NodeFigures
from ..adapters.store import JobStore, NodeFacts
from ..context import SchedulerContext
from ..domain import admission as quotas
from ..domain import jobs as rules
from ..domain.gang import lost_peers_note, node_stopped, peers_to_stop
from ..domain.job import Job
from ..domain.job_data import Progress
from ..usecases.producer_tokens import check_producer_token

Rt = Runtime[SchedulerContext]
Lifecycle = JobStartedV1 | JobProgressV1 | CheckpointWrittenV1 | JobPreemptedV1 | JobCompletedV1 | JobFailedV1


def own_job(env: Envelope, job: Job | None, what: str) -> Job | None:
    """A lifecycle event about a job speaks for the job's tenant or is refused (dead letter)."""
    if job is not None and job.tenant_id != env.tenant_id:
        raise PoisonMessage(f"{what} for job {job.job_id} names tenant {env.tenant_id!r}, not the job's own",
                            reason="tenant_mismatch")
    return job


async def lifecycle_job(rt: Rt, store: JobStore, env: Envelope, ev: Lifecycle, *, same_segment: bool = True,
                        stop_report: bool = False) -> Job | None:
    """The job a node's lifecycle event is about, locked, or None when the event has nothing to do.

    Refused (dead-lettered): another tenant's job (`tenant_mismatch`); an attempt the scheduler fenced
    or superseded (`stale_attempt`). The attempt is the event's `attempt`, else the one its segment id
    names (`<job>-s<n>`): attempt-less events of older producers are judged by their segment. An event
    naming neither (a segment-less job.failed) cannot come from a node, whose events always name their
    segment, and the state machine decides. The scheduler's own job.preempted / job.failed were
    applied when it published them and are skipped. ``same_segment``: ignore another segment's event;
    ``stop_report``: see `Job.stale` (gang members each report a preemption)."""
    job_id, segment = ev.job_id, ev.segment_id
    if env.producer == rt.name:
        return None
    job = own_job(env, await store.get(job_id, lock=True), env.event_type)
    if job is None:
        rt.log.warning("event for unknown job", job_id=job_id)
        return None
    if job.status == rules.CANCELLED:   # cancel won: what its nodes still report changes nothing
        rt.log.info("event of a cancelled job ignored", job_id=job_id, event_type=env.event_type, segment_id=segment)
        return None
    if why := job.stale(segment, ev.attempt, stop_report=stop_report):
        raise PoisonMessage(f"{env.event_type}: {why}", reason="stale_attempt")
    if same_segment and segment is not None and job.segment_id != segment:
        rt.log.info("event of another segment ignored", job_id=job_id, segment_id=segment)
        return None
    return job


async def on_job_requested(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobRequestedV1) -> None:
    """A job from an external producer: admitted only with a producer token for the envelope's tenant
    (refused to the DLQ otherwise, see `producer_tokens`)."""
    await check_producer_token(rt, uow, env)
    try:
        await submit_job(rt, JobStore(uow), env.tenant_id, ev, env.trace_id)
    except Rejected as exc:
        rt.ctx.metrics.rejected.labels(code=exc.code).inc()
        await uow.publish(JobFailedV1(job_id=ev.job_id, error_class="user", code=exc.code, message=exc.message),
                          tenant_id=env.tenant_id)
    except IdempotencyConflict as exc:
        raise PoisonMessage(str(exc)) from exc


def refuse_foreign_objects(rt: Rt, env: Envelope, uris: dict[str, str | None]) -> None:
    """A dataset event may only point at objects under its own tenant's prefix of the platform's bucket
    (a Hub id or another scheme is ingest's to judge): anything else is refused (dead letter)."""
    for field, uri in uris.items():
        if uri and uri.startswith("s3://") and not within_tenant(uri, env.tenant_id, rt.settings.bucket):
            raise PoisonMessage(f"{env.event_type}: {field} {uri} is not under tenant {env.tenant_id!r}'s prefix",
                                reason="tenant_mismatch")


async def on_dataset_submitted(rt: Rt, uow: UnitOfWork, env: Envelope, ev: DatasetSubmittedV1) -> None:
    """Remember that the dataset exists (validation pending), so a job naming it waits instead of failing."""
    refuse_foreign_objects(rt, env, {"source_uri": ev.source_uri})
    await JobStore(uow).dataset_submitted(env.tenant_id, ev.dataset_id, env.occurred_at)


async def on_dataset_validated(rt: Rt, uow: UnitOfWork, env: Envelope, ev: DatasetValidatedV1) -> None:
    refuse_foreign_objects(rt, env, {f: getattr(ev, f) for f in ("raw_uri", "train_uri", "validation_uri", "report_uri")})
    store = JobStore(uow)
    # under the tenant's admission lock: a create that read no verdict yet commits its job before the
    # jobs waiting for this file are looked up here, or reads this verdict itself
    await store.lock_tenant(env.tenant_id)
    await store.dataset_validated(env.tenant_id, ev)
    for job in await store.waiting_for(env.tenant_id, ev.dataset_id):
        await try_queue(rt, store, job)


async def on_node_heartbeat(rt: Rt, uow: UnitOfWork, env: Envelope, ev: NodeHeartbeatV1) -> None:
    """A node's capacity and liveness. Only the platform speaks for nodes, and a node cannot claim
    jobs the scheduler placed on another node (a forged or stale heartbeat is refused whole)."""
    if env.tenant_id != PLATFORM_TENANT:
        raise PoisonMessage(f"node.heartbeat of {ev.node_id} names tenant {env.tenant_id!r}; nodes belong to "
                            f"{PLATFORM_TENANT!r}", reason="tenant_mismatch")
    store = JobStore(uow)
    # one round trip (claims checked, node upserted, queue looked at): heartbeats share the consumer with
    # every job event, and a slow one delays the lost-node watcher, which waits for them to catch up. The
    # loop is woken only when this node adds capacity the last cycle did not see (it runs on its own anyway)
    foreign, wake = await store.heartbeat(NodeFacts(ev.node_id, ev.gpu_type, ev.gpu_count, ev.gpu_memory_gb,
                                                    ev.spot, ev.interconnect_group, ev.sent_at, ev.address,
                                                    free_gpu_ids=ev.free_gpu_ids, draining=ev.draining),
                                          ev.running_jobs, rt.ctx.clock() - rt.ctx.config.node_timeout)
    if foreign:  # nothing was written: the poison's transaction rolls back anyway
        raise PoisonMessage(f"node.heartbeat of {ev.node_id} claims jobs placed on other nodes: "
                            f"{', '.join(foreign)}", reason="foreign_job_claim")
    figures = NodeFigures.of(ev)
    uow.after_commit(lambda: rt.ctx.metrics.nodes.observe(ev.node_id, ev.gpu_type, figures))
    if wake:
        await store.wake_scheduler()


async def on_job_started(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobStartedV1) -> None:
    store = JobStore(uow)
    if job := await lifecycle_job(rt, store, env, ev):
        job.started(rt.ctx.clock(), ev.node_id, ev.started_at, ev.total_steps, ev.resumed_from_step)
        await store.save(job)


async def on_job_progress(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobProgressV1) -> None:
    store = JobStore(uow)
    job = await lifecycle_job(rt, store, env, ev)
    metrics = Progress.model_validate(ev.model_dump(include=set(Progress.model_fields), exclude_none=True))
    if job and job.progressed(rt.ctx.clock(), metrics):
        await store.save(job)


async def on_checkpoint_written(rt: Rt, uow: UnitOfWork, env: Envelope, ev: CheckpointWrittenV1) -> None:
    store = JobStore(uow)
    job = await lifecycle_job(rt, store, env, ev, same_segment=False)
    if job is None:
        return
    job.checkpoint_written(rt.ctx.clock(), ev.segment_id, ev.kind, ev.step, ev.uri, ev.manifest_sha256, ev.written_at)
    await store.save(job)
    at_step = job.progress if job.progress.step == ev.step else Progress()
    metrics: dict[str, float] = {}
    if at_step.loss is not None:
        metrics["train_loss"] = at_step.loss
    if at_step.token_accuracy is not None:
        metrics["token_accuracy"] = at_step.token_accuracy
    metrics.update(ev.metrics)
    await store.add_checkpoint(job.job_id, ev.checkpoint_id, ev.step, ev.kind, ev.uri, ev.written_at, metrics)


async def on_job_preempted(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobPreemptedV1) -> None:
    store = JobStore(uow)
    if job := await lifecycle_job(rt, store, env, ev, stop_report=True):
        peers = peers_to_stop(job, ev.node_id, ev.segment_id)
        blame = lost_peers_note(job, ev.node_id, ev.segment_id, ev.reason)   # names the gang's other nodes
        events = node_stopped(job, rt.ctx.clock(), ev, await store.queue_position(job.sort_key, job.job_id),
                              rt.ctx.config.max_node_lost_requeues)
        if blame and events and not job.terminal:
            job.note(rt.ctx.clock(), blame, level="warning", reason=ev.reason, reporter=ev.node_id)
        await store.save(job)
        await store.publish(job, [*events, *(peers if events else [])])
        await store.wake_scheduler()


async def on_job_completed(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobCompletedV1) -> None:
    store = JobStore(uow)
    job = await lifecycle_job(rt, store, env, ev)
    if job and job.training_completed(rt.ctx.clock(), ev.steps, ev.tokens, ev.final_checkpoint):
        await store.save(job)
        await store.wake_scheduler()


async def on_job_failed(rt: Rt, uow: UnitOfWork, env: Envelope, ev: JobFailedV1) -> None:
    store = JobStore(uow)
    job = await lifecycle_job(rt, store, env, ev)
    peers = peers_to_stop(job, ev.node_id, ev.segment_id) if job else []
    if job and job.training_failed(rt.ctx.clock(), ev.code, ev.message, ev.error_class):
        await store.save(job)
        await store.publish(job, peers)   # a gang's other ranks stop now, not at their own timeout
        await store.wake_scheduler()


async def on_eval_completed(rt: Rt, uow: UnitOfWork, env: Envelope, ev: EvalCompletedV1) -> None:
    store = JobStore(uow)
    job = own_job(env, await store.get(ev.job_id, lock=True), "eval.completed")
    if job is not None and job.status != rules.CANCELLED:
        job.evaluated(rt.ctx.clock(), ev)
        await store.save(job)


async def on_model_registered(rt: Rt, uow: UnitOfWork, env: Envelope, ev: ModelRegisteredV1) -> None:
    """The job's `fine_tuned_model` is the registered version's public id (its name from an older registry)."""
    store = JobStore(uow)
    job = own_job(env, await store.get(ev.lineage.job_id, lock=True), "model.registered")
    if job is not None:
        job.model_registered(rt.ctx.clock(), ev.fine_tuned_model or ev.name, ev.model_id)
        await store.save(job)


async def on_usage_metered(rt: Rt, uow: UnitOfWork, env: Envelope, ev: UsageMeteredV1) -> None:
    """Quota accounting arrives as events, never by reading metering's tables. Segment events
    (a job's segments as they end, and later corrections) add to the month as they come; the job
    total counts the job, and its GPU-seconds only where no segment event was seen."""
    store = JobStore(uow)
    owner = await store.owner_of(ev.job_id)
    if owner is not None and owner != env.tenant_id:
        raise PoisonMessage(f"usage.metered for job {ev.job_id} names tenant {env.tenant_id!r}, not the job's own",
                            reason="tenant_mismatch")
    key = "job" if ev.scope == "job" else f"segment:{ev.segment_id or ''}"
    if not await store.first_sight_of_usage(ev.job_id, key):
        return
    holder, before = await store.job_usage(ev.job_id, env.tenant_id)
    if holder != env.tenant_id:
        raise PoisonMessage(f"usage.metered for job {ev.job_id} names tenant {env.tenant_id!r},"
                            f" but the job's usage belongs to {holder!r}", reason="tenant_mismatch")
    after = (before.with_total(ev.billable_gpu_seconds, ev.cost) if ev.scope == "job"
             else before.with_segment(ev.billable_gpu_seconds, ev.cost))
    await store.save_job_usage(ev.job_id, after)
    seconds, cost = quotas.usage_delta(before, after)
    await store.add_tenant_usage(env.tenant_id, month_of(env.occurred_at), int(ev.scope == "job"), seconds, cost)
