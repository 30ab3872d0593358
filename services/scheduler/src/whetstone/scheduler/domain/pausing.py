"""Whether a job may be paused or resumed (`POST /v1/fine_tuning/jobs/{id}/pause|resume`), and why
not, in words the API answers with (409). The transitions themselves are `Job.pause` and, for a
resume, `Job.queue` (reached through the one queueing use case). Pure."""

from __future__ import annotations

from . import jobs as rules
from .job import Job

PAUSABLE = frozenset({rules.QUEUED, *rules.ACTIVE_ON_NODE})


def pause_refusal(job: Job) -> str | None:
    """Why the job cannot be paused, or None: a queued or training job can; a paused or pausing one
    is answered as it is (pausing twice is harmless)."""
    if job.status in PAUSABLE or job.status == rules.PAUSED:
        return None
    why = {rules.EVALUATING: "training has finished and is being evaluated",
           rules.VALIDATING: "its training file is still being validated"}.get(job.status, "it has ended")
    return f"job {job.job_id} is {job.public_status} ({why}): only a queued or running job can be paused"


def resume_refusal(job: Job) -> str | None:
    """Why the job cannot be resumed (only a paused one can), or None."""
    if job.status == rules.PAUSED:
        return None
    if job.pausing:
        return (f"job {job.job_id} is still pausing (its node is writing the emergency checkpoint): "
                "resume it once its status is paused")
    return f"job {job.job_id} is {job.public_status}, not paused: only a paused job can be resumed"
