"""The platform-side timeouts of a job's states, and which one a job has passed. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from . import jobs as rules
from .job import Job


@dataclass(frozen=True)
class Timeouts:
    """How long a job may sit in each non-terminal state on the platform's side (seconds)."""

    provisioning: float      # assigned, no job.started / progress yet
    running: float           # on the node, no progress, start or checkpoint for this long
    checkpointing: float     # checkpoint-and-stop requested, no job.preempted yet
    evaluating: float        # training succeeded, no eval.completed yet

    def shortest(self) -> float:
        return min(self.provisioning, self.running, self.checkpointing, self.evaluating)


def overdue(job: Job, now: datetime, limits: Timeouts) -> str | None:
    """The state whose platform-side timeout has passed (provisioning, running, checkpointing,
    evaluating), or None."""
    since = job.last_activity_at or job.updated_at
    if job.on_node and job.preempt_requested_at is not None:
        waited, state, limit = now - job.preempt_requested_at, "checkpointing", limits.checkpointing
    elif job.status == rules.CHECKPOINTING:
        waited, state, limit = now - since, "checkpointing", limits.checkpointing
    elif job.status == rules.PROVISIONING:
        waited, state, limit = now - since, "provisioning", limits.provisioning
    elif job.status == rules.RUNNING:
        waited, state, limit = now - since, "running", limits.running
    elif job.status == rules.EVALUATING:
        waited, state, limit = now - since, "evaluating", limits.evaluating
    else:
        return None
    return state if waited > timedelta(seconds=limit) else None
