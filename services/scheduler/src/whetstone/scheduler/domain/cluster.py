"""The cluster as one scheduling cycle sees it (pure: no IO).

`to_view` turns what the store read (the pool's nodes, the jobs on nodes, the queue heads) into the
policy's `Snapshot`, plus which GPU ids are held so that placements can name concrete GPUs. A GPU is
held when a job the scheduler placed holds it, or when the node's own heartbeat did not report it free
(a process still exiting, work the scheduler does not know of); a draining node offers nothing."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from .job_data import JobResources, PlacedPart, Progress
from .placement import Node, Shape
from .resources import canonical_gpu_type
from .snapshot import QueuedJob, RunningJob, Snapshot


@dataclass(frozen=True)
class PoolNode:
    """A node of the pool as the store knows it (heartbeats and the Kubernetes inventory)."""

    node_id: str
    gpu_type: str
    gpu_count: int
    spot: bool
    interconnect_group: str
    gpu_memory_gb: float = 0.0
    free_gpu_ids: Collection[int] | None = None   # its last heartbeat's free GPU ids; None: not reported
    draining: bool = False                        # its last heartbeat said it is stopping

    def unavailable(self) -> set[int]:
        """GPU ids the node itself says it cannot take new work on: all while it drains, else those its
        heartbeat did not report free (none when it reports nothing: the inventory, older agents)."""
        everything = set(range(self.gpu_count))
        if self.draining:
            return everything
        return set() if self.free_gpu_ids is None else everything - set(self.free_gpu_ids)

    def as_node(self, free: int | None = None) -> Node:
        return Node(self.node_id, canonical_gpu_type(self.gpu_type), self.gpu_count,
                    self.gpu_count if free is None else free, self.spot, self.interconnect_group)


@dataclass(frozen=True)
class ActiveJob:
    """A job on nodes, as the cycle needs it (victims, GPUs held, when it ends)."""

    job_id: str
    tier: str
    placement: list[PlacedPart]
    segment_started_at: datetime | None
    est_end_at: datetime | None
    last_checkpoint_at: datetime | None
    progress: Progress
    preempt_requested_at: datetime | None
    priority_preemptions: int
    queued_at: datetime | None


@dataclass(frozen=True)
class WaitingJob:
    """A queued job, as the cycle needs it."""

    job_id: str
    tenant_id: str
    tier: str
    queued_at: datetime
    resources: JobResources
    estimated_runtime_s: float | None
    progress: Progress = field(default_factory=Progress)
    spot_preemptions: int = 0
    queued_since: datetime | None = None   # start of the current queue period
    waited_s: float = 0.0                  # queue wait of the earlier periods

    def wait_s(self, now: datetime) -> float:
        """Queue wait so far over every queue period: the earlier ones, plus the current one."""
        since = self.queued_since or self.queued_at
        return self.waited_s + max((now - since).total_seconds(), 0.0)


@dataclass
class ClusterView:
    snapshot: Snapshot
    busy: dict[str, set[int]]          # node -> GPU ids held by jobs this scheduler placed, or not free per the node
    gpu_count: dict[str, int]


def describe_shapes(shapes: Sequence[Shape], limit: int = 4) -> str:
    return ", ".join(f"{s.nodes}x{s.gpus_per_node} {s.gpu_type}" for s in shapes[:limit])


def describe_pool(nodes: Sequence[Node]) -> str:
    return ", ".join(sorted({f"{n.gpu_count}x {n.gpu_type}" for n in nodes}))


def to_view(now: datetime, pool: Sequence[PoolNode], active: Sequence[ActiveJob], queued: Sequence[WaitingJob],
            checkpoint_s: float) -> ClusterView:
    busy: dict[str, set[int]] = {}
    running = []
    for r in active:
        nodes = tuple((p.node_id, len(p.gpu_ids)) for p in r.placement)
        for p in r.placement:
            busy.setdefault(p.node_id, set()).update(p.gpu_ids)
        started = (r.segment_started_at or now).timestamp()
        running.append(RunningJob(
            r.job_id, r.tier, nodes, started,
            r.est_end_at.timestamp() if r.est_end_at else started + 3600.0,
            r.last_checkpoint_at.timestamp() if r.last_checkpoint_at else None,
            r.progress.fraction(),
            r.preempt_requested_at.timestamp() + checkpoint_s if r.preempt_requested_at else None,
            r.priority_preemptions, r.queued_at.timestamp() if r.queued_at else None))
    for n in pool:
        if withheld := n.unavailable():
            busy.setdefault(n.node_id, set()).update(withheld)
    gpu_count = {n.node_id: n.gpu_count for n in pool}
    free = [n.as_node(max(0, n.gpu_count - len(busy.get(n.node_id, ())))) for n in pool]
    queue = [QueuedJob(q.job_id, q.tier, q.queued_at.timestamp(), q.resources.shapes,
                       (q.estimated_runtime_s or 3600.0) * (1 - q.progress.fraction()),
                       q.spot_preemptions, q.tenant_id, q.wait_s(now)) for q in queued]
    return ClusterView(Snapshot(now.timestamp(), free, running, queue), busy, gpu_count)


def pick_gpu_ids(node_id: str, count: int, view: ClusterView) -> list[int]:
    """The lowest GPU ids of the node that no job holds; marks them held."""
    held = view.busy.setdefault(node_id, set())
    ids = [g for g in range(view.gpu_count[node_id]) if g not in held][:count]
    held.update(ids)
    return ids
