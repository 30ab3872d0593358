"""The registry's typed dependencies, built once in bootstrap.py and read by handlers as `rt.ctx`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .adapters.artifacts import ArtifactStore
from .config import RegistrySettings


@dataclass
class RegistryContext:
    config: RegistrySettings
    artifacts: ArtifactStore
    environment: dict[str, Any]  # this process's lockfile: used when the artifact brings none
