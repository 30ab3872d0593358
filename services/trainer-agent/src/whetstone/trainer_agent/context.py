"""Everything the trainer agent's handlers depend on, typed (`rt.ctx`), built once in bootstrap.py."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from whetstone.contracts.enums import PreemptionReason
from whetstone.runtime.s3 import ObjectStore

from .adapters.checkpoint_store import S3Checkpoints
from .adapters.runs import RunStore
from .adapters.workspace import Workspaces
from .config import TrainerAgentSettings

if TYPE_CHECKING:
    from .usecases.segments import Segment


@dataclass
class NodeState:
    """What this node is doing right now, in memory (the `runs` table is the durable record)."""

    wakeup: asyncio.Event = field(default_factory=asyncio.Event)   # an assignment arrived
    capacity_changed: asyncio.Event = field(default_factory=asyncio.Event)  # heartbeat now: GPUs freed, drain
    segments: dict[str, Segment] = field(default_factory=dict)     # segment id -> segment running here
    tasks: set[asyncio.Task[None]] = field(default_factory=set)          # the segments' supervising tasks
    cancelled: set[str] = field(default_factory=set)               # job ids cancelled while running here
    preempt_reasons: dict[str, PreemptionReason] = field(default_factory=dict)  # job id -> a preempt request's
    fenced: dict[str, str] = field(default_factory=dict)           # segment id -> why the scheduler fenced it
    stopping: PreemptionReason | None = None                       # set by drain: drain | spot_loss
    recovered: bool = False       # the previous agent's runs were recovered (once per process)

    def segments_of(self, job_id: str) -> list[Segment]:
        return [s for s in self.segments.values() if s.job_id == job_id]


@dataclass
class ObjectStorage:
    """What needs the runtime's object store (it exists once the service starts)."""

    checkpoints: S3Checkpoints
    workspaces: Workspaces


@dataclass
class TrainerAgentContext:
    config: TrainerAgentSettings
    runs: RunStore = field(default_factory=RunStore)
    node: NodeState = field(default_factory=NodeState)
    _storage: ObjectStorage | None = None

    def attach_storage(self, store: ObjectStore, data_dir: Path, model_catalog: Path) -> None:
        """At service start (bootstrap's on_start): the checkpoint store and the scratch workspaces."""
        checkpoints = S3Checkpoints(store)
        root = (self.config.scratch_dir or data_dir / "scratch") / self.config.node_id
        self._storage = ObjectStorage(checkpoints, Workspaces(self.config, root, model_catalog, store, checkpoints))

    @property
    def checkpoints(self) -> S3Checkpoints:
        return self._require_storage().checkpoints

    @property
    def workspaces(self) -> Workspaces:
        return self._require_storage().workspaces

    def _require_storage(self) -> ObjectStorage:
        if self._storage is None:
            raise RuntimeError("trainer agent context used before the service started (no object store)")
        return self._storage
