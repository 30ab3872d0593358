"""Experiment tracking: a job that asked for `mlflow` gets one run on the operator's MLflow server, fed from
the registry's events (job.queued: params; job.progress: per-step metrics; eval.completed: the verdict;
registration: the model card as an artifact and the run's end; job.failed / job.cancelled: the run's end).

Handlers only queue items in the registry's own tables, in the event's transaction, each under a key (a
redelivered event queues nothing new), so a tracking server that is down never holds up a partition.
The tracker loop (`send_due`) sends them in order, makes the run once and stores its id, and on a
failure backs off; after `mlflow_give_up_after` failed tries in a row it gives the job's run up, with
an error log naming the job and the last error (the job itself is untouched)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from whetstone.contracts import EvalCompletedV1, JobProgressV1, JobQueuedV1
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Runtime

from ..adapters.mlflow import MlflowServer, TrackingRefused
from ..adapters.tracking_store import TrackedRun, TrackingStore
from ..context import RegistryContext
from ..domain import tracking as rules

Rt = Runtime[RegistryContext]


def _on(rt: Rt) -> bool:
    return rt.ctx.config.mlflow_tracking_uri is not None


async def job_queued(rt: Rt, uow: UnitOfWork, tenant_id: str, ev: JobQueuedV1, at: datetime) -> None:
    if not _on(rt):
        return
    settings = rules.mlflow_settings(ev)
    store = TrackingStore(uow.conn)
    if settings is None:
        if not await store.tracked(ev.job_id):
            await store.forget(ev.job_id)   # steps kept before this event, of a job that is not tracked
        return
    await store.track(ev.job_id, tenant_id, rules.experiment_for(tenant_id, settings),
                      settings.run_name or ev.job_id, rules.millis(at))
    await store.add(ev.job_id, "params", rules.params_of(ev))


async def progress(rt: Rt, uow: UnitOfWork, ev: JobProgressV1, at: datetime) -> None:
    """A step's figures, once per step (a redelivered or re-reported step keeps the first). A step read
    before the job's job.queued is kept too, until job.queued says whether the job is tracked."""
    if not _on(rt):
        return
    store = TrackingStore(uow.conn)
    if await store.tracked(ev.job_id) or not await store.job_known(ev.job_id):
        await store.add(ev.job_id, f"step:{ev.step}", rules.metrics_of(ev, at))


async def eval_completed(rt: Rt, uow: UnitOfWork, ev: EvalCompletedV1, at: datetime) -> None:
    if not _on(rt):
        return
    store = TrackingStore(uow.conn)
    if await store.tracked(ev.job_id):
        await store.add(ev.job_id, f"verdict:{ev.checkpoint_uri}", rules.verdict_of(ev, at, step=0))


async def model_registered(rt: Rt, uow: UnitOfWork, job_id: str, model_id: str, fine_tuned_model: str,
                           card_uri: str, at: datetime) -> None:
    if not _on(rt):
        return
    store = TrackingStore(uow.conn)
    if await store.tracked(job_id):
        for key, item in rules.registered(card_uri, model_id, fine_tuned_model, at):
            await store.add(job_id, key, item)


async def job_ended(rt: Rt, uow: UnitOfWork, job_id: str, status: rules.RunStatus, at: datetime) -> None:
    """A failed or cancelled job ends its run so (the first end queued is the one sent)."""
    if not _on(rt):
        return
    store = TrackingStore(uow.conn)
    if await store.tracked(job_id):
        await store.add(job_id, "end", rules.ended(status, at))


async def send_due(rt: Rt, server: MlflowServer) -> int:
    """One round of the tracker: every due run's queued items; the number of items sent."""
    async with rt.uow() as uow:
        runs = await TrackingStore(uow.conn).due(rt.clock())
    sent = 0
    for run in runs:
        sent += await _send_run(rt, server, run)
    return sent


async def _send_run(rt: Rt, server: MlflowServer, run: TrackedRun) -> int:
    async with rt.uow() as uow:
        items = await TrackingStore(uow.conn).pending(run.job_id)
    done: list[str] = []
    error: str | None = None
    give_up = False
    try:
        run_id = run.run_id or await _make_run(rt, server, run)
        for pending in items:
            try:
                await _send(rt, server, run_id, pending.body)
            except TrackingRefused as exc:   # this item only (e.g. a value MLflow will not take): skipped
                rt.log.warning("mlflow refused a tracking item; skipped", job_id=run.job_id, item=pending.item,
                               error=str(exc))
            done.append(pending.item)
    except TrackingRefused as exc:   # the experiment or run itself: trying again would not help
        error, give_up = str(exc), True
    except Exception as exc:  # noqa: BLE001 - down, 5xx, the card unreadable: retried later, never fatal
        error = f"{type(exc).__name__}: {exc}"
    now = rt.clock()
    async with rt.uow() as uow:
        store = TrackingStore(uow.conn)
        if done:
            await store.sent(run.job_id, done, now)
        if error is not None:
            cfg = rt.ctx.config
            attempts = 0 if done else run.attempts + 1
            give_up = give_up or attempts >= cfg.mlflow_give_up_after
            retry_at = now + timedelta(seconds=rules.retry_delay_s(attempts, cfg.mlflow_retry_s,
                                                                                cfg.mlflow_retry_max_s))
            await store.failed(run.job_id, error, retry_at, give_up)
            if give_up:
                rt.log.error("mlflow tracking given up for the job; its run misses what was not sent",
                             job_id=run.job_id, experiment=run.experiment, tries=attempts, error=error)
            else:
                rt.log.warning("mlflow tracking failed; will retry", job_id=run.job_id, tries=attempts,
                               retry_at=retry_at.isoformat(), error=error)
    return len(done)


async def _make_run(rt: Rt, server: MlflowServer, run: TrackedRun) -> str:
    """The job's run, made once: one made before its id was stored is found by its job tag."""
    experiment_id = run.experiment_id or await server.experiment_id(run.experiment)
    run_id = await server.run_of_job(experiment_id, run.job_id) or await server.create_run(
        experiment_id, run.run_name, run.job_id, run.start_ms)
    async with rt.uow() as uow:
        await TrackingStore(uow.conn).run_made(run.job_id, experiment_id, run_id)
    rt.log.info("mlflow run made", job_id=run.job_id, experiment=run.experiment, run_id=run_id)
    return run_id


async def _send(rt: Rt, server: MlflowServer, run_id: str, item: rules.TrackingItem) -> None:
    for batch in rules.batches(item):
        await server.log_batch(run_id, batch)
    if item.artifact is not None:
        data = await asyncio.to_thread(rt.ctx.artifacts.read, item.artifact.source_uri)
        await server.upload(run_id, item.artifact.path, data, item.artifact.content_type)
    if item.end is not None:
        await server.end_run(run_id, item.end.value, item.end_time or rules.millis(rt.clock()))
