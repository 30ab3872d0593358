"""Resident adapters under an LRU budget: cold loads from S3 on demand (one download per adapter
even when many requests want it at once), unloads on archive, pins while requests run."""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from whetstone.runtime.s3 import ObjectStore
from whetstone.serving.domain.catalog import BASE_ADAPTER, AdapterUnavailable, ModelVersion, ServingError
from whetstone.serving.domain.residency import LruBudget

from .artifacts import fetch_adapter
from .batcher import Batcher
from .engine import LoraEngine


@dataclass
class Lease:
    """A resident adapter, pinned (never evicted) until `release()`."""

    pool: AdapterPool
    adapter: str
    chat_template: str | None
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.pool._unpin(self.adapter)


class AdapterPool:
    def __init__(self, engine: LoraEngine, batcher: Batcher, *, budget: int, scratch: Path) -> None:
        self.engine, self.batcher, self.scratch = engine, batcher, scratch
        self.store: ObjectStore | None = None  # the runtime's, bound when the service starts
        self.lru = LruBudget(budget)
        self.templates: dict[str, str | None] = {}
        self.versions: dict[str, str] = {}  # model_id -> artifact sha256 of what is resident
        self._loading: dict[str, asyncio.Task] = {}
        self._failed: dict[tuple[str, str | None], ServingError] = {}
        self._doomed: set[str] = set()
        self._slots = asyncio.Lock()
        self.cold_load_ms: deque[float] = deque(maxlen=10_000)
        self.on_cold_load = None  # optional callback(ms) for metrics

    def bind(self, store: ObjectStore) -> None:
        self.store = store

    def resident(self, model_id: str) -> bool:
        return model_id in self.lru

    async def acquire(self, version: ModelVersion) -> Lease:
        key = version.model_id
        if key == BASE_ADAPTER:  # the base alone: always resident, nothing to pin
            return Lease(self, key, None)
        failure = self._failed.get((key, version.artifact_sha256))
        if failure is not None:
            raise failure
        if key in self.lru and self.versions.get(key) != version.artifact_sha256:
            # the registry now points this id at other bytes: never answer from the old ones
            if self.lru.pinned(key):
                self._doomed.add(key)
                raise AdapterUnavailable(f"`{version.name}` is being replaced by a new artifact; retry shortly.")
            await self.unload(key)
        while key not in self.lru:
            task = self._loading.get(key)
            if task is None:
                task = self._loading[key] = asyncio.create_task(self._load(version))
                task.add_done_callback(lambda _t, k=key: self._loading.pop(k, None))
            await asyncio.shield(task)
        self._doomed.discard(key)
        self.lru.touch(key)
        self.lru.pin(key)
        return Lease(self, key, self.templates.get(key))

    async def preload(self, version: ModelVersion) -> None:
        (await self.acquire(version)).release()

    async def _load(self, version: ModelVersion) -> None:
        assert self.store is not None, "adapter pool used before the service started"
        started = time.perf_counter()
        dest = self.scratch / f"{version.model_id}-{uuid.uuid4().hex[:8]}"
        try:
            fetched = await asyncio.to_thread(fetch_adapter, self.store, version, dest,
                                              self.engine.tokenizer.chat_template)
            parsed = await asyncio.to_thread(self.engine.read, fetched.directory)
        except ServingError as exc:
            self._remember(version, exc)
            raise
        finally:
            await asyncio.to_thread(shutil.rmtree, dest, True)
        async with self._slots:
            victims = self.lru.victims_for(1)
            self.lru.remove(victims)
            for v in victims:
                self.templates.pop(v, None)
                self.versions.pop(v, None)

            def swap() -> None:
                for v in victims:
                    self.engine.unload(v)
                self.engine.load(version.model_id, parsed)

            try:
                await self.batcher.run_op(swap)
            except ServingError as exc:
                self._remember(version, exc)
                raise
            self.templates[version.model_id] = fetched.chat_template
            self.versions[version.model_id] = version.artifact_sha256 or ""
            self.lru.add(version.model_id)
        elapsed = (time.perf_counter() - started) * 1000
        self.cold_load_ms.append(elapsed)
        if self.on_cold_load:
            self.on_cold_load(elapsed)

    def _remember(self, version: ModelVersion, exc: ServingError) -> None:
        """Bad bytes stay bad: refuse them fast next time (a retryable outage is not remembered)."""
        if exc.status < 500:
            self._failed[(version.model_id, version.artifact_sha256)] = exc

    async def unload(self, model_id: str) -> None:
        """Drop an adapter now, or when its last running request ends."""
        if model_id not in self.lru:
            return
        if self.lru.pinned(model_id):
            self._doomed.add(model_id)
            return
        async with self._slots:
            self.lru.remove([model_id])
            self.templates.pop(model_id, None)
            self.versions.pop(model_id, None)
            await self.batcher.run_op(lambda: self.engine.unload(model_id))

    def _unpin(self, model_id: str) -> None:
        self.lru.unpin(model_id)
        if model_id in self._doomed and not self.lru.pinned(model_id):
            self._doomed.discard(model_id)
            asyncio.get_running_loop().create_task(self.unload(model_id))
