"""The registry's background loops."""

from __future__ import annotations

import asyncio

from whetstone.runtime.service import Runtime

from ..adapters.store import ModelStore
from ..adapters.vllm import VllmFleet
from ..context import RegistryContext
from ..usecases.handoff import sync_fleet


async def vllm_handoff(rt: Runtime[RegistryContext]) -> None:
    """Keep the configured vLLM fleet in step with the registry, every `vllm_sync_interval_s`."""
    cfg = rt.ctx.config
    root = cfg.vllm_adapter_dir or rt.settings.data_dir / "vllm-loras"
    fleet = VllmFleet(cfg.vllm_urls, api_key=cfg.vllm_api_key)
    try:
        while True:
            async with rt.uow() as uow:
                models = await ModelStore(uow.conn).in_stages(cfg.vllm_stages)
            report = await sync_fleet(rt, fleet, root, models)
            if report.loaded or report.unloaded or report.errors:
                rt.log.info("vllm fleet synced", loaded=report.loaded, unloaded=report.unloaded, errors=report.errors)
            await asyncio.sleep(cfg.vllm_sync_interval_s)
    finally:
        await fleet.close()
