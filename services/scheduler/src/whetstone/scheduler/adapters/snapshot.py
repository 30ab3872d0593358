"""Postgres -> the pure core's `Snapshot` (nodes, running jobs, queue heads)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from ..domain import jobs as J
from ..domain.placement import Node, Shape
from ..domain.policy import QueuedJob, RunningJob, Snapshot
from ..domain.resources import canonical_gpu_type

ACTIVE = sorted(J.ACTIVE_ON_NODE)


@dataclass
class ClusterView:
    snapshot: Snapshot
    busy: dict[str, set[int]]          # node -> GPU ids held by jobs this scheduler placed
    gpu_count: dict[str, int]


def progress_fraction(progress: dict[str, Any] | None) -> float:
    if not progress:
        return 0.0
    step, total = progress.get("step"), progress.get("total_steps")
    return min(1.0, step / total) if step and total else 0.0


def shapes_of(resources: dict[str, Any] | None) -> tuple[Shape, ...]:
    if not resources:
        return ()
    if "shapes" in resources:
        return tuple(Shape.from_dict(s) for s in resources["shapes"])
    return (Shape(resources["gpu_type"], resources["gpus_per_node"], resources.get("nodes", 1)),)


async def load_cluster(conn: asyncpg.Connection, now: datetime, node_timeout: timedelta, queue_limit: int,
                       checkpoint_s: float) -> ClusterView:
    node_rows = await conn.fetch(
        "SELECT node_id, gpu_type, gpu_count, spot, interconnect_group FROM nodes"
        " WHERE NOT lost AND schedulable AND last_seen >= $1 ORDER BY node_id", now - node_timeout)
    active = await conn.fetch(
        "SELECT job_id, tier, placement, segment_started_at, est_end_at, last_checkpoint_at, progress,"
        " preempt_requested_at, priority_preemptions FROM jobs WHERE status = ANY($1::text[])", ACTIVE)
    queued = await conn.fetch(
        "SELECT job_id, tenant_id, tier, queued_at, resources, estimated_runtime_s, progress, spot_preemptions"
        " FROM jobs WHERE status = 'queued' ORDER BY sort_key, job_id LIMIT $1", queue_limit)
    return to_view(now, node_rows, active, queued, checkpoint_s)


def to_view(now: datetime, node_rows: list, active: list, queued: list, checkpoint_s: float) -> ClusterView:
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
            r["priority_preemptions"]))
    gpu_count = {r["node_id"]: r["gpu_count"] for r in node_rows}
    nodes = [Node(r["node_id"], canonical_gpu_type(r["gpu_type"]), r["gpu_count"],
                  max(0, r["gpu_count"] - len(busy.get(r["node_id"], ()))), r["spot"], r["interconnect_group"])
             for r in node_rows]
    queue = [QueuedJob(r["job_id"], r["tier"], r["queued_at"].timestamp(), shapes_of(r["resources"]),
                       (r["estimated_runtime_s"] or 3600.0) * (1 - progress_fraction(r["progress"])),
                       r["spot_preemptions"], r["tenant_id"]) for r in queued]
    return ClusterView(Snapshot(now.timestamp(), nodes, running, queue), busy, gpu_count)


def pick_gpu_ids(node_id: str, count: int, view: ClusterView) -> list[int]:
    """The lowest GPU ids of the node that no job holds; marks them held."""
    held = view.busy.setdefault(node_id, set())
    ids = [g for g in range(view.gpu_count[node_id]) if g not in held][:count]
    held.update(ids)
    return ids
