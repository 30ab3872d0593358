"""Wiring: the scheduler service definition. Every dependency of the service is built here, once,
into `SchedulerContext` (handlers read it as `rt.ctx`)."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter
from whetstone.runtime.service import Runtime, Service

from .entrypoints import api, graders_api, handlers, keys_api, operator_api, result_files, templates, watchers, webhooks

from .usecases import merges, rft, training_files
from .adapters.catalog import ModelCatalog
from .adapters.metrics import SchedulerMetrics, event_metrics
from .adapters.migrations import MIGRATIONS
from .adapters.probes import PROBES
from .config import SchedulerSettings
from .context import Clock, SchedulerContext
from .entrypoints.loop import SchedulingLoop


def utc_now() -> datetime:
    return datetime.now(UTC)


def routes(rt: Runtime[SchedulerContext]) -> APIRouter:
    router = APIRouter()
    for part in (api.routes, templates.routes, webhooks.routes, keys_api.routes, graders_api.routes,
                 operator_api.routes):
        router.include_router(part(rt))
    return router


def build_service(config: SchedulerSettings | None = None, clock: Clock = utc_now) -> Service[SchedulerContext]:
    config = config or SchedulerSettings()
    ctx = SchedulerContext(config=config, policy=config.policy(), clock=clock, metrics=SchedulerMetrics(),
                           loop=SchedulingLoop(), models=ModelCatalog(hub_models=config.hub_models),
                           graders=rft.environment())
    background = [ctx.loop.run, watchers.watch_lost_nodes, watchers.watch_timeouts, watchers.expire_waiting_jobs,
                  webhooks.send_webhooks]
    if config.k8s_inventory:
        background.append(watchers.sync_kubernetes)

    async def on_start(rt: Runtime[SchedulerContext]) -> None:
        rt.metrics.registry.register(ctx.metrics.registry)   # served on the service's /metrics

    return Service(
        name="scheduler",
        migrations=MIGRATIONS,
        probes=PROBES,
        event_metrics=event_metrics,
        subscriptions={
            "job.requested": handlers.on_job_requested,
            "dataset.submitted": handlers.on_dataset_submitted,
            "dataset.validated": handlers.on_dataset_validated,
            "dataset.deleted": training_files.on_dataset_deleted,
            "node.heartbeat": handlers.on_node_heartbeat,
            "job.started": handlers.on_job_started,
            "job.progress": handlers.on_job_progress,
            "checkpoint.written": handlers.on_checkpoint_written,
            "job.preempted": handlers.on_job_preempted,
            "job.completed": handlers.on_job_completed,
            "job.failed": handlers.on_job_failed,
            "eval.completed": handlers.on_eval_completed,
            "model.registered": webhooks.notifying(handlers.on_model_registered),
            "model.promoted": webhooks.on_model_event,
            "usage.metered": handlers.on_usage_metered,
            "model.merge_requested": merges.on_merge_requested,
            "file.created": result_files.on_file_created,
        },
        routes=routes,
        background=background,
        on_start=on_start,
        http_port=config.http_port,
        context=ctx,
        # job.requested -> job.assigned is latency-bound: poll the broker often instead of the client's
        # 500 ms default fetch wait (the embedded broker answers an idle fetch only when it expires).
        consumer_options={"fetch_max_wait_ms": config.fetch_max_wait_ms},
    )
