"""What the eval service keeps about a job and an evaluation run: the job as projected from
`job.queued`, its final checkpoint, a run held under a lease, and what a run starts from. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from whetstone.contracts import EvalRequestedV1, EvalStageResult, TrainingSpec


class RunStatus(StrEnum):
    """An evaluation run's state in the queue of runs."""

    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    SUPERSEDED = "superseded"   # its checkpoint stopped being the job's (fenced, newer attempt, cancel)


@dataclass(frozen=True)
class EvalJob:
    """A job as eval projected it from `job.queued`."""

    job_id: str
    tenant_id: str
    spec: TrainingSpec
    tier: str | None = None
    suffix: str | None = None   # the user's model-name suffix: part of the lineage


@dataclass(frozen=True)
class FinalCheckpoint:
    """The final checkpoint of the job's newest attempt, the one its own run evaluates."""

    job_id: str
    tenant_id: str
    uri: str
    manifest_sha256: str
    trace_id: str
    attempt: int | None = None


@dataclass(frozen=True)
class AcceptedAdapter:
    """The same lineage's last adapter that passed the gate (the holdout compares with it)."""

    job_id: str
    adapter_uri: str
    adapter_manifest_sha256: str


@dataclass(frozen=True)
class Claim:
    """A run held under a lease: a job's own evaluation (run_id = job_id, request None) or an
    `eval.requested` command (the command in `request`)."""

    run_id: str
    tenant_id: str
    attempts: int
    owner: str
    job_id: str = ""
    request: EvalRequestedV1 | None = None
    trace_id: str | None = None


@dataclass(frozen=True)
class RunInputs:
    """What a claimed run starts from: the job projection (None when eval never saw the job), the final
    checkpoint (job runs only) and the stages the run already recorded, by stage name."""

    job: EvalJob | None = None
    checkpoint: FinalCheckpoint | None = None
    done: Mapping[str, EvalStageResult] = field(default_factory=dict)


def job_run_id(job_id: str, attempt: int | None) -> str:
    """A job's own evaluation: one run per attempt that wrote a final checkpoint."""
    return job_id if (attempt or 1) <= 1 else f"{job_id}~a{attempt}"


def lineage_key(tenant_id: str, job: EvalJob | None) -> str:
    """Same lineage = same tenant, same base weights, same model suffix."""
    if job is None:
        return f"{tenant_id}||"
    return f"{tenant_id}|{job.spec.base_model_sha256}|{job.suffix or ''}"
