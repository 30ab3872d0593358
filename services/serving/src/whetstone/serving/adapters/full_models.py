"""Full-weight models resident beside the served base, each in an engine (and batcher) of its own.

A version is fetched by its manifest (which gives every file's size, so the budget is checked before a
byte is downloaded), every file verified against its sha256, then loaded as a base with no adapter
(the engine's slot 0). Resident ones are unloaded least recently used first when a newcomer needs the
room; one in use is never unloaded."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from whetstone.runtime.chat_templates import TEMPLATE_FILES
from whetstone.runtime.checkpoints import CorruptCheckpoint, download_checkpoint, read_manifest
from whetstone.runtime.s3 import ObjectStore
from whetstone.runtime.weights import full_model_files, weight_shards

from ..config import ServingSettings
from ..domain.catalog import AdapterCorrupted, AdapterUnavailable, ChatTemplateMismatch, ModelVersion
from ..domain.full_models import MIB, FullModelOverBudget, over_budget, to_evict
from .artifacts import template_from
from .batcher import Batcher
from .engine import LoraEngine


@dataclass
class Resident:
    engine: LoraEngine
    batcher: Batcher
    chat_template: str | None
    weights_bytes: int
    artifact_sha256: str
    pins: int = 0


@dataclass
class FullLease:
    """A resident full-weight model, kept loaded until `release()`."""

    pool: FullModelPool
    model_id: str
    engine: LoraEngine
    batcher: Batcher
    chat_template: str | None
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.pool.resident[self.model_id].pins -= 1


class FullModelPool:
    def __init__(self, config: ServingSettings, scratch: Path) -> None:
        self.config, self.scratch = config, scratch
        self.budget_bytes = config.full_model_budget_mb * MIB
        self.store: ObjectStore | None = None
        self.resident: OrderedDict[str, Resident] = OrderedDict()
        self._lock = asyncio.Lock()

    def bind(self, store: ObjectStore) -> None:
        self.store = store

    async def acquire(self, version: ModelVersion) -> FullLease:
        async with self._lock:   # one load at a time: a full model is large
            held = self.resident.get(version.model_id)
            if held is not None and held.artifact_sha256 != (version.artifact_sha256 or "") and not held.pins:
                await self._unload(version.model_id)
                held = None
            if held is None:
                held = await self._load(version)
            self.resident.move_to_end(version.model_id)
            held.pins += 1
        return FullLease(self, version.model_id, held.engine, held.batcher, held.chat_template)

    async def _load(self, version: ModelVersion) -> Resident:
        assert self.store is not None, "full-model pool used before the service started"
        manifest = await asyncio.to_thread(self._manifest, version)
        files = full_model_files(manifest)
        size = sum(manifest[f] for f in weight_shards(files))
        if (refused := over_budget(version, size, self.budget_bytes)) is not None:
            raise refused
        victims = to_evict({k: r.weights_bytes for k, r in self.resident.items()},
                           {k for k, r in self.resident.items() if r.pins}, size, self.budget_bytes)
        if victims is None:
            raise AdapterUnavailable(f"`{version.name}` needs {size / MIB:.1f} MiB of the full-model budget, "
                                     "which full-weight models in use hold now; retry shortly.")
        for victim in victims:
            await self._unload(victim)
        dest = self.scratch / f"{version.model_id}-{uuid.uuid4().hex[:8]}"
        try:
            await asyncio.to_thread(self._download, version, files + [f for f in TEMPLATE_FILES
                                                                     if f in manifest and f not in files], dest)
            template = template_from(dest, {p.name for p in dest.iterdir()})
            if version.chat_template_sha256 and (
                    not template or hashlib.sha256(template.encode()).hexdigest() != version.chat_template_sha256):
                raise ChatTemplateMismatch(f"The chat template stored with `{version.name}` is not the one it was "
                                           "trained with (sha256 differs); refusing to serve it with another.")
            engine = await asyncio.to_thread(LoraEngine, dest, slots=1, max_rank=1,
                                             threads=self.config.torch_threads)
        finally:
            await asyncio.to_thread(shutil.rmtree, dest, True)
        batcher = Batcher(engine, window_ms=self.config.batch_window_ms, max_batch=self.config.max_batch_size,
                          mixed=self.config.mixed_batches)
        batcher.start()
        held = self.resident[version.model_id] = Resident(engine, batcher, template, size,
                                                          version.artifact_sha256 or "")
        return held

    def _manifest(self, version: ModelVersion) -> dict[str, int]:
        """{file: size} from the version's manifest, its sha256 checked against the registry's."""
        assert self.store is not None
        try:
            manifest, _ = read_manifest(self.store, (version.artifact_uri or "").rstrip("/"), version.artifact_sha256)
        except (CorruptCheckpoint, ValueError) as exc:
            raise AdapterCorrupted(f"The artifact of `{version.name}` cannot be trusted: {exc}") from exc
        return manifest.sizes()

    def _download(self, version: ModelVersion, files: list[str], dest: Path) -> None:
        assert self.store is not None
        dest.mkdir(parents=True, exist_ok=True)
        try:
            download_checkpoint(self.store, (version.artifact_uri or "").rstrip("/"), dest,
                                version.artifact_sha256, only=files)
        except CorruptCheckpoint as exc:
            raise AdapterCorrupted(f"The weights of `{version.name}` do not match their sha256: {exc}") from exc

    async def unload(self, model_id: str) -> None:
        """Drop a model now if no request holds it (archived versions); else it goes when evicted."""
        async with self._lock:
            held = self.resident.get(model_id)
            if held is not None and not held.pins:
                await self._unload(model_id)

    async def _unload(self, model_id: str) -> None:
        held = self.resident.pop(model_id)
        await asyncio.to_thread(held.batcher.stop)

    async def stop(self) -> None:
        for model_id in list(self.resident):
            await self._unload(model_id)


__all__ = ["FullLease", "FullModelOverBudget", "FullModelPool"]
