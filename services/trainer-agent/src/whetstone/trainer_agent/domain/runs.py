"""A run: one segment of a job assigned to this node (a row of the agent's `runs` table). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from whetstone.contracts import CheckpointRef, Rendezvous, TrainingSpec
from whetstone.contracts.enums import SpecMethod

from .checkpoints import AttemptFence


class RunStatus(StrEnum):
    ASSIGNED = "assigned"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


class RunOutcome(StrEnum):
    """How a finished run ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    WORKER_DONE = "worker_done"   # a non-zero-rank node's launcher ended cleanly (rank 0 reports)
    FENCED = "fenced"


@dataclass(frozen=True)
class RunUpdate:
    """What a segment's supervisor records on its run (None: unchanged)."""

    status: RunStatus | None = None
    outcome: RunOutcome | None = None
    finished_at: datetime | None = None
    latest_checkpoint: CheckpointRef | None = None
    pid: int | None = None
    pid_start: int | None = None


@dataclass(frozen=True)
class Run:
    segment_id: str
    job_id: str
    node_id: str
    tenant_id: str
    trace_id: str
    attempt: int
    gpu_ids: tuple[int, ...]
    spec: TrainingSpec
    resume_from: CheckpointRef | None = None    # what the scheduler asked this segment to resume from
    rendezvous: Rendezvous | None = None        # multi-node gangs: where the nodes meet
    latest_checkpoint: CheckpointRef | None = None
    pid: int | None = None
    pid_start: int | None = None

    @property
    def fence(self) -> AttemptFence:
        return AttemptFence(self.tenant_id, self.job_id, self.attempt)

    @property
    def is_merge(self) -> bool:
        return self.spec.method == SpecMethod.MERGE

    @property
    def durable_checkpoint(self) -> CheckpointRef | None:
        """Where the job can go on from: the newest checkpoint this run stored, else its own start."""
        return self.latest_checkpoint or self.resume_from


def image_pin_problem(pinned: str | None, running: str | None) -> str | None:
    """Why this agent may not train a job pinned to the trainer image `pinned` (name@sha256:<hex>)
    when it runs `running` (its WHETSTONE_IMAGE_DIGEST, a digest or a name@digest; None: unknown);
    None when it may. The digests decide: the same bytes under another registry name still match."""
    if pinned is None:
        return None
    want = pinned.rsplit("@", 1)[-1]
    if running is None:
        return (f"the job pins trainer image {pinned} (image) and this node does not know its own image "
                "(WHETSTONE_IMAGE_DIGEST is unset): a pinned job trains only where the digest is known")
    have = running.rsplit("@", 1)[-1]
    if have != want:
        return f"the job pins trainer image {pinned} (image); this node runs {running}"
    return None
