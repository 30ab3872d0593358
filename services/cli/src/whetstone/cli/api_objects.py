"""The public API's objects as the CLI reads them: OpenAI's own types (`openai.types`) with the platform's
extra fields typed. Each response is parsed once with `from_api`, the way the `openai` client parses
its responses (`construct`: lenient, a missing field is its default, unknown fields stay in `model_extra`).
`--json` prints the response itself, never a re-dump of these objects."""

from __future__ import annotations

from typing import Generic, Self, TypeVar

from openai import BaseModel
from openai.types import FileDeleted, FileObject, Model
from openai.types.fine_tuning import FineTuningJob, FineTuningJobEvent
from openai.types.fine_tuning.fine_tuning_job import Method
from openai.types.fine_tuning.jobs import FineTuningJobCheckpoint
from pydantic import Field

T = TypeVar("T")

__all__ = [
    "ApiFile",
    "ApiKey",
    "Checkpoint",
    "FileDeleted",
    "Job",
    "JobEvent",
    "JobUsage",
    "ListItem",
    "ModelContent",
    "MonthUsage",
    "Page",
    "RegistryModel",
]


class _FromApi(BaseModel):
    @classmethod
    def from_api(cls, raw: object) -> Self:
        """This object built from a response's JSON object."""
        if not isinstance(raw, dict):
            raise TypeError(f"expected a JSON object for {cls.__name__}, got {type(raw).__name__}")
        return cls.construct(**raw)


class ListItem(_FromApi):
    """Any item of a list object: what paging needs of it."""
    id: str | None = None


class Page(_FromApi, Generic[T]):
    """OpenAI's list object."""
    object: str | None = None
    data: list[T] | None = None
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None


# ------------------------------------------------------------------ files


class ValidationIssue(_FromApi):
    line: int | None = None
    message: str | None = None
    code: str | None = None


class FileValidation(_FromApi):
    """The platform's validation report of an uploaded training file."""
    status: str | None = None
    rows_kept: int | None = None
    rows_total: int | None = None
    format: str | None = None
    schema_: str | None = Field(None, alias="schema")
    tokens_total: int | None = None
    errors: list[ValidationIssue] | None = None
    warnings: list[ValidationIssue] | None = None


class ApiFile(FileObject, _FromApi):
    dataset_purpose: str | None = "-"
    validation: FileValidation | None = None


# ------------------------------------------------------------------- jobs


class Progress(_FromApi):
    """The trainer's latest report on a running job."""
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    step_time_s: float | None = None


class EvalMetric(_FromApi):
    name: str = "?"
    base: float | None = None
    candidate: float | None = None


class EvalStage(_FromApi):
    name: str | None = None
    status: str | None = None
    reason: str | None = None


class JobEval(_FromApi):
    """The eval gate's verdict on the job's model, with its reasons, metrics and stages."""
    verdict: str | None = None
    reasons: list[str] | None = None
    metrics: list[EvalMetric] | None = None
    stages: list[EvalStage] | None = None
    checkpoint_uri: str | None = None


class PlatformMethod(_FromApi):
    """`method.whetstone`: the platform's own training method (lora, qlora, full, cpt, orpo, ...)."""
    method: str = "-"


class JobMethod(Method):
    whetstone: PlatformMethod | None = None


class Job(FineTuningJob, _FromApi):
    """A fine-tuning job: OpenAI's fields, the finer `state`, the trainer's `progress` and the eval verdict."""
    state: str | None = None
    progress: Progress | None = None
    eval: JobEval | None = None
    method: JobMethod | None = None


class EventData(_FromApi):
    step: int | None = None
    loss: float | None = None
    train_loss: float | None = None


class JobEvent(FineTuningJobEvent, _FromApi):
    data: EventData | None = None


class Checkpoint(FineTuningJobCheckpoint, _FromApi):
    kind: str | None = None
    uri: str | None = None


# ----------------------------------------------------------------- models


class StageChange(_FromApi):
    from_stage: str | None = None
    to_stage: str | None = None
    stage: str | None = None
    actor: str | None = None
    approved_by: str | None = None
    at: float | str | None = None
    created_at: float | str | None = None
    reason: str | None = None


class Lineage(_FromApi):
    base_model: str | None = None
    base_model_sha256: str | None = None
    dataset_id: str | None = None
    dataset_version: str | None = None
    method: str | None = None
    hyperparameters_hash: str | None = None
    eval_verdict: str | None = None
    eval: object | None = None   # the registry's eval record, shown as JSON


class RegistryModel(Model, _FromApi):
    """A model of the registry: OpenAI's model object with its job, stage, lineage and stage history."""
    model_type: str | None = None
    job_id: str | None = None
    stage: str | None = None
    name: str | None = None
    fine_tuned_model: str | None = None
    lineage: Lineage | None = None
    needs_reeval: bool | None = None
    stage_history: list[StageChange] | None = None


class ContentFile(_FromApi):
    name: str
    url: str
    sha256: str | None = None


class ModelContent(_FromApi):
    """`GET /models/{id}/content`: the adapter's files, each with a download URL and its sha256."""
    base_model: str | None = None
    files: list[ContentFile] | None = None


# ------------------------------------------------------------------ keys


class ApiKey(_FromApi):
    """An API key or producer token (`/v1/keys`); its secret (`key` or `token`) only in the create answer."""
    id: str | None = None
    object: str | None = None
    tenant_id: str | None = None
    name: str | None = None
    scopes: list[str] = Field(default_factory=list)
    status: str | None = None
    key: str | None = None
    token: str | None = None


# ------------------------------------------------------------------ usage


class UsageTotal(_FromApi):
    gpu_seconds: float = 0
    billable_gpu_seconds: float = 0
    cost: float = 0
    charge_class: str | None = None


class JobUsage(_FromApi):
    """`GET /usage/jobs/{id}`: a job's metered segments and their total."""
    job_id: str | None = None
    status: str | None = None
    total: UsageTotal | None = None
    lines: list[object] | None = None


class GpuTypeUsage(_FromApi):
    gpu_type: str
    gpu_hours: float
    spend: float


class MonthUsage(_FromApi):
    """`GET /usage?month=`: the key's tenant's month."""
    tenant_id: str | None = None
    month: str | None = None
    jobs: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    success_rate: float | None = None
    gpu_hours: float = 0
    billable_gpu_hours: float = 0
    spend: float = 0
    currency: str = "USD"
    refunded: float = 0
    under_review: float = 0
    by_gpu_type: list[GpuTypeUsage] | None = None
