"""Wiring: the serving service definition and its typed context."""

from __future__ import annotations

import asyncio
from pathlib import Path

from whetstone.runtime.models import resolve_model
from whetstone.runtime.service import Runtime, Service
from whetstone.runtime.settings import CommonSettings, load_stack_env

from .adapters.batcher import Batcher
from .adapters.engine import LoraEngine
from .adapters.full_models import FullModelPool
from .adapters.metrics import ServingMetrics
from .adapters.migrations import MIGRATIONS
from .adapters.pool import AdapterPool
from .adapters.repository import AsyncpgServingRepository
from .config import ServingSettings
from .context import ServingContext
from .entrypoints import handlers, loops
from .entrypoints.api import routes
from .usecases.projection import sync_projection


def build_context(config: ServingSettings, common: CommonSettings) -> ServingContext:
    base = resolve_model(config.base_model, common.model_catalog)
    engine = LoraEngine(base.location, slots=config.max_resident_adapters, max_rank=config.max_lora_rank,
                        threads=config.torch_threads)
    batcher = Batcher(engine, window_ms=config.batch_window_ms, max_batch=config.max_batch_size,
                      mixed=config.mixed_batches)
    scratch = Path(common.data_dir) / "serving" / "downloads"
    pool = AdapterPool(engine, batcher, budget=config.max_resident_adapters, scratch=scratch)
    metrics = ServingMetrics()
    pool.on_cold_load = lambda ms: metrics.cold_load.observe(ms / 1000)
    return ServingContext(config=config, base_model=config.base_model, base_sha256=base.sha256, engine=engine,
                          batcher=batcher, pool=pool, repo=AsyncpgServingRepository(), metrics=metrics,
                          full_models=FullModelPool(config, Path(common.data_dir) / "serving" / "full-models"))


async def on_start(rt: Runtime[ServingContext]) -> None:
    rt.ctx.repo.bind(rt.pool)
    rt.ctx.pool.bind(rt.store)  # the runtime's S3 client, not a second one
    rt.ctx.full_models.bind(rt.store)
    rt.ctx.metrics.register(rt.metrics.registry)
    rt.ctx.batcher.start()
    await sync_projection(rt, act=False)  # the catalog is complete before the API opens


async def on_stop(rt: Runtime[ServingContext]) -> None:
    await asyncio.to_thread(rt.ctx.batcher.stop)
    await rt.ctx.full_models.stop()


def build_service(config: ServingSettings | None = None,
                  common: CommonSettings | None = None) -> Service[ServingContext]:
    config = config or ServingSettings()
    if common is None:
        load_stack_env(CommonSettings().data_dir)  # `python -m whetstone.serving` next to `whet stack up`
        common = CommonSettings()
    return Service(name="serving", migrations=MIGRATIONS, routes=routes, http_port=config.http_port,
                   context=build_context(config, common), on_start=on_start, on_stop=on_stop,
                   background=[loops.follow_projection],
                   consumer_options={"fetch_max_wait_ms": config.fetch_max_wait_ms},
                   subscriptions={"model.registered": handlers.on_model_registered,
                                  "model.promoted": handlers.on_model_promoted,
                                  "checkpoint.written": handlers.on_checkpoint_written})
