"""The registry's background loops."""

from __future__ import annotations

import asyncio

from whetstone.runtime.service import Runtime

from ..adapters.mlflow import MlflowServer
from ..adapters.store import ModelStore
from ..adapters.vllm import VllmFleet
from ..context import RegistryContext
from ..usecases import tracking
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


async def mlflow_tracker(rt: Runtime[RegistryContext]) -> None:
    """Send tracked jobs' queued items to the operator's MLflow server (usecases/tracking.py); a round that
    sent nothing waits `mlflow_poll_s`. A failure of a round (the database away) is logged, never fatal."""
    cfg = rt.ctx.config
    assert cfg.mlflow_tracking_uri is not None
    server = MlflowServer(cfg.mlflow_tracking_uri, timeout_s=cfg.mlflow_timeout_s)
    try:
        while True:
            try:
                sent = await tracking.send_due(rt, server)
            except Exception as exc:  # noqa: BLE001 - the loop outlives a bad round
                rt.log.warning("mlflow tracker round failed", error=f"{type(exc).__name__}: {exc}")
                sent = 0
            if not sent:
                await asyncio.sleep(cfg.mlflow_poll_s)
    finally:
        await server.close()
