"""Public names derived from ids, computed the same way by every service that shows or resolves them.

A fine-tuned model's public id is OpenAI's `fine_tuned_model` shape, `ft:<base>:<tenant>:<suffix>:<job>`
(`ft:<base>:<tenant>::<job>` without a suffix), where `<job>` is the last 12 hex digits of the job id:
stable (a function of the job alone), unique per tenant in practice (48 bits of the job id's hash; the
registry enforces uniqueness and falls back to the whole job id on a clash). A checkpoint of the job is
`<fine_tuned_model>:ckpt-step-<N>`. A job's results file id is derived from the job id, so the scheduler
can name it and ingest can create it without either reading the other's tables."""

from __future__ import annotations

import hashlib
import re

JOB_SHORT_CHARS = 12
CHECKPOINT_MARK = ":ckpt-step-"
_CHECKPOINT = re.compile(r"^(?P<model>ft:.+):ckpt-step-(?P<step>\d{1,12})$")


def base_short_name(base_model: str) -> str:
    """The last path component of a base reference (a Hub id's repository, a local directory's name)."""
    return base_model.rstrip("/").rsplit("/", 1)[-1]


def fine_tuned_model_for(base_model: str, tenant_id: str, suffix: str | None, job_id: str, *,
                         full_job_id: bool = False) -> str:
    """`ft:<base>:<tenant>:<suffix>:<job>`; `full_job_id` spells the whole job id (the registry's fallback
    when the short form is already taken by another job of the tenant)."""
    job = job_id if full_job_id else job_id.removeprefix("ftjob-")[-JOB_SHORT_CHARS:]
    return f"ft:{base_short_name(base_model)}:{tenant_id}:{suffix or ''}:{job}"


def checkpoint_model_for(fine_tuned_model: str, step: int) -> str:
    """OpenAI's `fine_tuned_model_checkpoint`: the job's model name and the checkpoint's step."""
    return f"{fine_tuned_model}{CHECKPOINT_MARK}{step}"


def parse_checkpoint_model(name: str) -> tuple[str, int] | None:
    """(fine_tuned_model, step) of a checkpoint name; None when `name` names no checkpoint."""
    m = _CHECKPOINT.match(name)
    return (m["model"], int(m["step"])) if m else None


def result_file_id_for(job_id: str) -> str:
    """The id of the job's results CSV (OpenAI's `result_files`), a file of the job's tenant."""
    return "file-res-" + hashlib.sha256(f"results\x00{job_id}".encode()).hexdigest()[:24]
