"""Background handoff: keep the configured vLLM fleet serving what the registry says (production
versions under their name, other configured stages under their model id)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from whetstone.runtime.service import Runtime

from .adapters.artifacts import ArtifactStore
from .adapters.store import ModelStore
from .adapters.vllm import VllmFleet, lay_out_for_resolver
from .context import RegistryContext
from .domain.lineage import ADAPTER_FILES
from .domain.stages import ModelRecord


def materialise(artifacts: ArtifactStore, model: ModelRecord, root: Path) -> Path:
    """The adapter on the shared disk, verified against its manifest, laid out for vLLM (once)."""
    target = root / model.model_id
    if (target / "adapter_config.json").is_file():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        artifacts.fetch_verified(model.artifact_uri, model.artifact_sha256, ADAPTER_FILES, Path(tmp))
        return lay_out_for_resolver(root, model.model_id, Path(tmp), model.lineage["base_model"])


async def vllm_handoff(rt: Runtime[RegistryContext]) -> None:
    cfg = rt.ctx.config
    root = cfg.vllm_adapter_dir or rt.settings.data_dir / "vllm-loras"
    fleet = VllmFleet(cfg.vllm_urls, api_key=cfg.vllm_api_key)
    try:
        while True:
            async with rt.uow() as uow:
                models = await ModelStore(uow.conn).in_stages(cfg.vllm_stages)
            desired = {}
            for m in models:
                try:
                    path = await asyncio.to_thread(materialise, rt.ctx.artifacts, m, root)
                except Exception as exc:  # a corrupt or missing artifact is never handed over
                    rt.log.error("adapter not handed to vLLM", model_id=m.model_id, error=f"{type(exc).__name__}: {exc}")
                    continue
                desired[m.name if m.stage == "production" else m.model_id] = str(path)
            report = await fleet.sync(desired)
            if report.loaded or report.unloaded or report.errors:
                rt.log.info("vllm fleet synced", loaded=report.loaded, unloaded=report.unloaded, errors=report.errors)
            await asyncio.sleep(cfg.vllm_sync_interval_s)
    finally:
        await fleet.close()
