"""Wiring: the registry service definition — the one place its dependencies are built."""

from __future__ import annotations

from fastapi import APIRouter

from whetstone.runtime.service import Runtime, Service

from .adapters.artifacts import ArtifactStore
from .adapters.environment import capture_environment
from .adapters.metrics import event_metrics
from .adapters.migrations import MIGRATIONS
from .config import RegistrySettings
from .context import RegistryContext
from .entrypoints import api, handlers, loops


def routes(rt: Runtime[RegistryContext]) -> APIRouter:
    router = APIRouter()
    router.include_router(api.routes(rt))
    router.include_router(api.base_model_routes(rt))
    return router


async def on_start(rt: Runtime[RegistryContext]) -> None:
    rt.ctx.artifacts.bind(rt.store)


def build_context(config: RegistrySettings | None = None) -> RegistryContext:
    return RegistryContext(config=config or RegistrySettings(), artifacts=ArtifactStore(),
                           environment=capture_environment())


def build_service(config: RegistrySettings | None = None) -> Service[RegistryContext]:
    context = build_context(config)
    return Service(name="registry", migrations=MIGRATIONS, routes=routes, http_port=context.config.http_port,
                   context=context, on_start=on_start, event_metrics=event_metrics,
                   background=([loops.vllm_handoff] if context.config.vllm_urls else [])
                   + ([loops.mlflow_tracker] if context.config.mlflow_tracking_uri else []),
                   subscriptions={"job.queued": handlers.on_job_queued,
                                  "job.progress": handlers.on_job_progress,   # experiment tracking's metrics
                                  "job.failed": handlers.on_job_failed,
                                  "checkpoint.written": handlers.on_checkpoint_written,
                                  "eval.completed": handlers.on_eval_completed,
                                  "model.merged": handlers.on_model_merged,
                                  "node.fenced": handlers.on_node_fenced,
                                  "job.cancelled": handlers.on_job_cancelled})
