"""Handoff: the vLLM fleet serves what the registry says (production versions under their name,
other configured stages under their model id)."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from whetstone.contracts.enums import ModelStage
from whetstone.runtime.service import Runtime

from ..adapters.artifacts import ArtifactStore
from ..adapters.store import ModelStore
from whetstone.runtime.weights import full_model_files, holds_full_weights

from ..adapters.vllm import SyncReport, VllmFleet, lay_out_for_resolver, lay_out_full_model
from ..context import RegistryContext
from ..domain.lineage import ADAPTER_FILES, VisionSettings
from ..domain.vllm_serve import PROCESSOR_FILES, SERVE_FILE, TEMPLATE_FILE
from ..domain.stages import ModelRecord


def materialise(artifacts: ArtifactStore, model: ModelRecord, root: Path, vision: VisionSettings | None = None) -> Path:
    """The adapter on the shared disk, verified against its manifest, laid out for vLLM (once); a vision
    adapter with its chat template and processor config and the multimodal settings vLLM needs."""
    target = root / model.model_id
    if (target / "adapter_config.json").is_file() or (target / SERVE_FILE).is_file():
        return target
    if model.lineage is None:
        raise ValueError(f"model {model.model_id} has no lineage: its base model is unknown")
    if holds_full_weights(model.files):   # a model of its own: laid out for `vllm serve <dir>`
        with tempfile.TemporaryDirectory() as tmp:
            artifacts.fetch_verified(model.artifact_uri, model.artifact_sha256, tuple(full_model_files(model.files)),
                                     Path(tmp))
            return lay_out_full_model(root, model.model_id, Path(tmp), model.fine_tuned_model or model.name,
                                      model.lineage.base_model)
    extras = tuple(name for name in (TEMPLATE_FILE, *PROCESSOR_FILES) if vision and name in model.files)
    with tempfile.TemporaryDirectory() as tmp:
        artifacts.fetch_verified(model.artifact_uri, model.artifact_sha256, ADAPTER_FILES + extras, Path(tmp))
        return lay_out_for_resolver(root, model.model_id, Path(tmp), model.lineage.base_model, vision)


async def vision_of(rt: Runtime[RegistryContext], model_id: str) -> VisionSettings | None:
    """A vision adapter's processor and image settings, from its lineage (None for a text adapter)."""
    async with rt.uow() as uow:
        stored = await ModelStore(uow.conn).stored_lineage(model_id)
    return stored.record.vision if stored else None


async def sync_fleet(rt: Runtime[RegistryContext], fleet: VllmFleet, root: Path,
                     models: list[ModelRecord]) -> SyncReport:
    """One round: every model of the handed-off stages laid out on disk, the fleet moved to exactly those."""
    desired = {}
    for m in models:
        try:
            vision = None if (root / m.model_id / "adapter_config.json").is_file() else await vision_of(rt, m.model_id)
            path = await asyncio.to_thread(materialise, rt.ctx.artifacts, m, root, vision)
        except Exception as exc:  # a corrupt or missing artifact is never handed over
            rt.log.error("adapter not handed to vLLM", model_id=m.model_id, error=f"{type(exc).__name__}: {exc}")
            continue
        if holds_full_weights(m.files):   # not a LoRA of the fleet's base: its own `vllm serve` (whetstone_vllm.json)
            rt.log.info("full-weight model laid out for its own vLLM server", model_id=m.model_id, path=str(path))
            continue
        desired[m.name if m.stage == ModelStage.PRODUCTION else m.model_id] = str(path)
    return await fleet.sync(desired)
