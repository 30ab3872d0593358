"""What one scheduling cycle reads and what it decides (plain data, no logic): the snapshot of
nodes, running and queued jobs that `policy.cycle` takes, and the assignments, preemptions and
reservations it returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .placement import Node, Placement, Shape


# ---------------------------------------------------------------- snapshot


@dataclass(slots=True)
class QueuedJob:
    job_id: str
    tier: str
    queued_at: float                     # seconds; kept across preemptions
    shapes: tuple[Shape, ...]            # acceptable shapes, most preferred first
    est_runtime_s: float                 # remaining work by its estimate
    spot_preemptions: int = 0
    tenant_id: str = ""
    waited_s: float | None = None        # queue wait so far, all segments (None: since queued_at)

    def wait(self, now: float) -> float:
        return self.waited_s if self.waited_s is not None else now - self.queued_at


@dataclass(slots=True)
class RunningJob:
    job_id: str
    tier: str
    nodes: tuple[tuple[str, int], ...]   # (node_id, GPUs)
    started_at: float                    # start of the current segment
    est_end: float
    last_checkpoint_at: float | None = None
    progress: float = 0.0                # fraction of the job done
    stopping_at: float | None = None     # preemption requested: its GPUs free about then
    priority_preemptions: int = 0
    queued_at: float | None = None       # first queued (kept across preemptions)

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.nodes)


@dataclass(slots=True)
class Snapshot:
    now: float
    nodes: Sequence[Node]                # schedulable nodes only
    running: Sequence[RunningJob]
    queue: Sequence[QueuedJob]


# --------------------------------------------------------------- decisions


@dataclass(frozen=True, slots=True)
class Assignment:
    job_id: str
    placement: Placement
    backfilled: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str                          # the victim
    for_job_id: str
    reason: str
    stop_by: float
    work_at_risk_s: float                # GPU-seconds since its last checkpoint


@dataclass(slots=True)
class Reservation:
    job_id: str
    start: float
    nodes: dict[str, int]                # node -> GPUs the job will take there
    extra: dict[str, int]                # node -> GPUs still spare there at ``start``
    kind: str = "easy"                   # easy | hold (premium, after preemption or natural)


@dataclass
class CycleResult:
    assignments: list[Assignment] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    order: list[str] = field(default_factory=list)     # the queue in policy order
    decisions: int = 0
    wakeup_at: float | None = None       # when a time-driven decision (wait target) is next due
