"""The serving service's typed dependencies, built once in bootstrap.py and read as `rt.ctx`."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from .adapters.batcher import Batcher
from .adapters.engine import LoraEngine
from .adapters.full_models import FullModelPool
from .adapters.metrics import ServingMetrics
from .adapters.pool import AdapterPool
from .adapters.repository import AsyncpgServingRepository
from .config import ServingSettings
from .domain.catalog import LiveCatalog


@dataclass
class ServingContext:
    config: ServingSettings
    base_model: str
    base_sha256: str
    engine: LoraEngine
    batcher: Batcher
    pool: AdapterPool
    repo: AsyncpgServingRepository
    metrics: ServingMetrics
    full_models: FullModelPool
    random: random.Random = field(default_factory=random.Random)
    projection_changed: asyncio.Event = field(default_factory=asyncio.Event)
    # per (tenant, requested name, model_id): requests served since start (the A/B view)
    served: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # per tenant: completion requests in the batcher now, queued or generating (usecases/inference.admit)
    pending: dict[str, int] = field(default_factory=dict)
    background: set[asyncio.Task] = field(default_factory=set)
    catalog: LiveCatalog = field(default_factory=LiveCatalog)
    synced_to: int = 0  # the model_versions change sequence the catalog reflects
    synced_to_routes: int = 0
