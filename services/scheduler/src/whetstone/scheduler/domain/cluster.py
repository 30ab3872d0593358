"""The cluster as one scheduling cycle sees it, built from plain rows (pure: no IO).

`to_view` turns the rows the store read (nodes, jobs on nodes, queue heads) into the policy's
`Snapshot`, plus which GPU ids are held so that placements can name concrete GPUs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .placement import Node, Shape
from .snapshot import QueuedJob, RunningJob, Snapshot
from .resources import canonical_gpu_type

Row = Mapping[str, Any]


@dataclass
class ClusterView:
    snapshot: Snapshot
    busy: dict[str, set[int]]          # node -> GPU ids held by jobs this scheduler placed
    gpu_count: dict[str, int]


def progress_fraction(progress: Mapping[str, Any] | None) -> float:
    if not progress:
        return 0.0
    step, total = progress.get("step"), progress.get("total_steps")
    return min(1.0, step / total) if step and total else 0.0


def shapes_of(resources: Mapping[str, Any] | None) -> tuple[Shape, ...]:
    if not resources:
        return ()
    if "shapes" in resources:
        return tuple(Shape.from_dict(s) for s in resources["shapes"])
    return (Shape(resources["gpu_type"], resources["gpus_per_node"], resources.get("nodes", 1)),)


def describe_shapes(shapes: Sequence[Shape], limit: int = 4) -> str:
    return ", ".join(f"{s.nodes}x{s.gpus_per_node} {s.gpu_type}" for s in shapes[:limit])


def describe_pool(nodes: Sequence[Node]) -> str:
    return ", ".join(sorted({f"{n.gpu_count}x {n.gpu_type}" for n in nodes}))


def to_view(now: datetime, node_rows: Sequence[Row], active: Sequence[Row], queued: Sequence[Row],
            checkpoint_s: float) -> ClusterView:
    busy: dict[str, set[int]] = {}
    running = []
    for r in active:
        nodes = tuple((p["node_id"], len(p["gpu_ids"])) for p in r["placement"] or [])
        for p in r["placement"] or []:
            busy.setdefault(p["node_id"], set()).update(p["gpu_ids"])
        started = (r["segment_started_at"] or now).timestamp()
        running.append(RunningJob(
            r["job_id"], r["tier"], nodes, started,
            r["est_end_at"].timestamp() if r["est_end_at"] else started + 3600.0,
            r["last_checkpoint_at"].timestamp() if r["last_checkpoint_at"] else None,
            progress_fraction(r["progress"]),
            r["preempt_requested_at"].timestamp() + checkpoint_s if r["preempt_requested_at"] else None,
            r["priority_preemptions"], r["queued_at"].timestamp() if r["queued_at"] else None))
    gpu_count = {r["node_id"]: r["gpu_count"] for r in node_rows}
    nodes = [Node(r["node_id"], canonical_gpu_type(r["gpu_type"]), r["gpu_count"],
                  max(0, r["gpu_count"] - len(busy.get(r["node_id"], ()))), r["spot"], r["interconnect_group"])
             for r in node_rows]
    queue = [QueuedJob(r["job_id"], r["tier"], r["queued_at"].timestamp(), shapes_of(r["resources"]),
                       (r["estimated_runtime_s"] or 3600.0) * (1 - progress_fraction(r["progress"])),
                       r["spot_preemptions"], r["tenant_id"], queue_wait_s(now, r)) for r in queued]
    return ClusterView(Snapshot(now.timestamp(), nodes, running, queue), busy, gpu_count)


def queue_wait_s(now: datetime, row: Row) -> float:
    """Queue wait so far over every queue period: the earlier ones, plus the current one."""
    since = row.get("queued_since") or row["queued_at"]
    return (row.get("waited_s") or 0.0) + max((now - since).total_seconds(), 0.0)


def pick_gpu_ids(node_id: str, count: int, view: ClusterView) -> list[int]:
    """The lowest GPU ids of the node that no job holds; marks them held."""
    held = view.busy.setdefault(node_id, set())
    ids = [g for g in range(view.gpu_count[node_id]) if g not in held][:count]
    held.update(ids)
    return ids
