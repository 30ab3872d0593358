"""The eval service's typed dependencies, built once in `bootstrap.py`, read by handlers as `rt.ctx`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .adapters.judges import Judge, ModelSafetyClassifier
from .config import EvalSettings


@dataclass
class EvalContext:
    config: EvalSettings
    judge: Judge | None = None
    safety_classifier: ModelSafetyClassifier | None = None
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)   # a new evaluation was requested
