"""The ingest service's typed dependencies, built once in `bootstrap.build_service`.

Handlers read them as `rt.ctx` (`Runtime[IngestContext]`); the runtime itself gives the
pool, the object store (`rt.store`), the common settings (`rt.settings`) and the logger."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .config import IngestSettings
from .domain.contamination import ReferenceIndex
from .domain.toxicity import ToxicityClassifier


@dataclass
class IngestContext:
    config: IngestSettings
    toxicity: ToxicityClassifier | None                     # None: toxicity screening off
    # the last reference index built (benchmarks + a tenant's own sets), keyed by its files' identity
    reference_cache: dict[tuple, ReferenceIndex] = field(default_factory=dict)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)   # a validation was queued
    wandb_wakeup: asyncio.Event = field(default_factory=asyncio.Event)   # a W&B offline run was queued
