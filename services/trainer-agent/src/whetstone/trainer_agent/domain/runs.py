"""A run: one segment of a job assigned to this node (a row of the agent's `runs` table). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from whetstone.contracts import CheckpointRef

from .checkpoints import AttemptFence, checkpoint_ref

STATUSES = ("assigned", "running", "finished", "cancelled", "interrupted")


@dataclass(frozen=True)
class Run:
    segment_id: str
    job_id: str
    node_id: str
    tenant_id: str
    trace_id: str
    attempt: int
    gpu_ids: tuple[int, ...]
    spec: dict[str, Any]                        # the job's TrainingSpec as JSON
    resume_from: CheckpointRef | None = None    # what the scheduler asked this segment to resume from
    rendezvous: dict[str, Any] | None = None    # multi-node: master, node rank, nodes
    latest_checkpoint: CheckpointRef | None = None
    pid: int | None = None
    pid_start: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        return cls(
            segment_id=row["segment_id"], job_id=row["job_id"], node_id=row["node_id"], tenant_id=row["tenant_id"],
            trace_id=row["trace_id"], attempt=int(row["attempt"]), gpu_ids=tuple(row["gpu_ids"] or ()),
            spec=dict(row["spec"]), resume_from=checkpoint_ref(row["resume_from"]),
            rendezvous=row.get("rendezvous"), latest_checkpoint=checkpoint_ref(row.get("latest_checkpoint")),
            pid=row.get("pid"), pid_start=row.get("pid_start"))

    @property
    def fence(self) -> AttemptFence:
        return AttemptFence(self.tenant_id, self.job_id, self.attempt)

    @property
    def durable_checkpoint(self) -> CheckpointRef | None:
        """Where the job can go on from: the newest checkpoint this run stored, else its own start."""
        return self.latest_checkpoint or self.resume_from
