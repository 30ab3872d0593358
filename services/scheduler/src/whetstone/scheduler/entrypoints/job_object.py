"""The job API's answer: OpenAI's `fine_tuning.job` object with the platform's facts beside OpenAI's
fields, as response models (the routes declare them, so the OpenAPI document describes the answer).

A field marked `Field(exclude_if=_absent)` is left out of the JSON while it is None (OpenAI's method
object names only its own family; a knob the job never set is not echoed); `NoNulls` writes a nested
object without its None fields."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, WrapSerializer

from whetstone.contracts import EvalStageResult, Hyperparameters, Metric, ResourceRequest
from whetstone.contracts.enums import EvalVerdict, JobStatus, ReasoningEffort
from whetstone.contracts.events import EvalConfigObject, GraderObject, ResponseFormatObject
from whetstone.contracts.integrations import Integration

from ..domain.job_data import (
    AssignedShape, JobError, MemoryGb, PlacedPart, Progress, QuotaRecord, StoredCheckpoint, TemplateUse,
)
from ..domain.placement import Shape


def _absent(value: object) -> bool:
    return value is None


def _without_nulls(value: object) -> object:
    """A nested object's JSON as `model_dump(exclude_none=True)` writes it."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


# a lambda has no return annotation: the field keeps its own schema in the OpenAPI document
NoNulls = WrapSerializer(lambda value, write: _without_nulls(write(value)))


class SupervisedHyperparameters(BaseModel):
    """OpenAI's `hyperparameters` (`batch_size` = examples per optimizer step) with the platform's split
    of it (`micro_batch_size`), the resolved knobs the job set, and `auto`: the knobs admission chose."""

    n_epochs: int | None
    batch_size: int | Literal["auto"] | None
    learning_rate_multiplier: float | None
    micro_batch_size: int | Literal["auto"] | None
    learning_rate: float | None = Field(default=None, exclude_if=_absent)
    lora_r: int | None = Field(default=None, exclude_if=_absent)
    lora_alpha: int | None = Field(default=None, exclude_if=_absent)
    gradient_accumulation_steps: int | None = Field(default=None, exclude_if=_absent)
    gradient_checkpointing: bool | None = Field(default=None, exclude_if=_absent)
    max_seq_len: int | None = Field(default=None, exclude_if=_absent)
    auto: list[str] | None = Field(default=None, exclude_if=_absent)


class DpoHyperparameters(SupervisedHyperparameters):
    beta: float | None


class ReinforcementHyperparameters(BaseModel):
    n_epochs: int | None = None
    batch_size: int | None = None
    learning_rate_multiplier: float | None = None
    compute_multiplier: float | None = None
    eval_interval: int | None = None
    eval_samples: int | None = None
    reasoning_effort: ReasoningEffort | None = None


class SupervisedMethod(BaseModel):
    hyperparameters: SupervisedHyperparameters


class DpoMethod(BaseModel):
    hyperparameters: DpoHyperparameters


class ReinforcementMethod(BaseModel):
    grader: GraderObject | None
    hyperparameters: ReinforcementHyperparameters
    response_format: ResponseFormatObject | None = Field(default=None, exclude_if=_absent)


class WhetstoneMethod(BaseModel):
    method: str = Field(description="the platform's method (lora, qlora, full, cpt, dpo, orpo, reinforcement, merge)")


class MethodObject(BaseModel):
    """OpenAI's `method`: its type and the block of that family only, and the platform's method."""

    type: Literal["supervised", "dpo", "reinforcement"]
    supervised: SupervisedMethod | None = Field(default=None, exclude_if=_absent)
    dpo: DpoMethod | None = Field(default=None, exclude_if=_absent)
    reinforcement: ReinforcementMethod | None = Field(default=None, exclude_if=_absent)
    whetstone: WhetstoneMethod

    @property
    def hyperparameters(self) -> DpoHyperparameters | SupervisedHyperparameters | ReinforcementHyperparameters:
        block = self.supervised or self.dpo or self.reinforcement
        assert block is not None, "a method object has its family's block"
        return block.hyperparameters


class EvalView(BaseModel):
    """The eval gate's verdict on the job's final checkpoint."""

    checkpoint_uri: str
    verdict: EvalVerdict
    reasons: list[str]
    metrics: list[Metric]
    stages: list[EvalStageResult]


class ResourcesView(BaseModel):
    """What admission planned (the request, the acceptable shapes, the memory estimate, the base's size)
    and the shape of the current segment."""

    request: ResourceRequest | Literal["auto"]
    shapes: tuple[Shape, ...]
    memory_gb: MemoryGb
    params: int
    params_source: str
    assigned: AssignedShape | None


class Preemptions(BaseModel):
    spot: int
    priority: int


class PreemptionRequest(BaseModel):
    at: int | None
    reason: str | None
    for_job: str | None


class FineTuningJob(BaseModel):
    """OpenAI's `fine_tuning.job`; `state` is the platform's finer status (`status` is OpenAI's)."""

    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    organization_id: str
    model: str
    training_file: str
    validation_file: str | None
    status: str
    created_at: int | None
    finished_at: int | None
    fine_tuned_model: str | None
    result_files: list[str]
    trained_tokens: int | None
    hyperparameters: DpoHyperparameters | SupervisedHyperparameters | ReinforcementHyperparameters
    method: MethodObject
    seed: int | None
    estimated_finish: int | None
    error: JobError | None
    metadata: dict[str, str] | None
    integrations: list[Annotated[Integration, NoNulls]]
    user_provided_suffix: str | None
    template: TemplateUse | None
    # the platform's own
    state: JobStatus
    tier: str
    tenant_id: str
    resolved_hyperparameters: Annotated[Hyperparameters, NoNulls] | None
    base_model_sha256: str | None
    dataset_version: str | None
    eval_config: EvalConfigObject | None
    image: str | None
    progress: Annotated[Progress, NoNulls]
    latest_checkpoint: Annotated[StoredCheckpoint, NoNulls] | None
    node_id: str | None
    placement: list[PlacedPart]
    attempt: int
    fenced_attempt: int | None
    timeouts: int
    eval: EvalView | None
    idempotency_key: str
    trace_id: str | None
    resources: ResourcesView
    estimated_runtime_s: float | None
    quota: QuotaRecord | None
    preemptions: Preemptions
    preemption_requested: PreemptionRequest | None
    queue_position: int | None
    estimated_start_at: int | None
