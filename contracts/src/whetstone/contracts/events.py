"""One versioned pydantic model per event of the topic table (DESIGN.md §2)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from .base import Contract, Event, GivenFieldsOnly, JsonAtMost
from .dataset_stats import DatasetStats
from .enums import (
    CheckpointKind,
    DatasetStatus,
    ErrorClass,
    Method,
    PreemptionReason,
    PreemptRequestReason,
    Purpose,
    ReasoningEffort,
    SpecMethod,
)
from .estimates import CostEstimate
from .integrations import Integration


# ----------------------------------------------------------------- datasets


class ValidationIssue(Contract):
    code: str
    message: str
    line: int | None = None
    field: str | None = None


class DatasetSubmittedV1(Event):
    EVENT_TYPE = "dataset.submitted"
    dataset_id: str = Field(max_length=128, description="content address of the raw upload: ds-<sha256 prefix>")
    name: str = Field(max_length=512)
    source_uri: str = Field(max_length=2048, description="s3://bucket/key of the raw upload, under the tenant's prefix")
    purpose: Purpose = Purpose.SFT
    base_model: str | None = Field(default=None, max_length=256)
    size_bytes: int | None = None


class DatasetValidatedV1(Event):
    EVENT_TYPE = "dataset.validated"
    dataset_id: str
    version: str = Field(description="sha256 of the raw content")
    name: str
    status: DatasetStatus
    purpose: Purpose = Purpose.SFT
    format: str | None = None
    data_schema: str | None = None
    rows_total: int = 0
    rows_kept: int = 0
    tokens_total: int | None = None
    errors: list[ValidationIssue] = Field(default_factory=list)
    error_count: int = 0
    warnings: list[ValidationIssue] = Field(default_factory=list)
    stats: DatasetStats = Field(default_factory=DatasetStats)
    policies: dict[str, str] = Field(default_factory=dict)
    raw_uri: str | None = None
    train_uri: str | None = None
    validation_uri: str | None = None
    report_uri: str | None = None
    cost_estimate: CostEstimate | None = Field(default=None, description="ingest's cost per GPU type and method")


class DatasetDeletedV1(Event):
    """A file deleted through the Files API (DELETE /v1/files/{id}): no job may train on it any more.
    Ingest refuses the delete (409 file_in_use) while it knows of a job queued on the file; a job whose
    admission crossed the delete fails with `training_file_deleted` unless it is already on a node."""

    EVENT_TYPE = "dataset.deleted"
    dataset_id: str = Field(description="the deleted file's id (its dataset id)")


class FileCreatedV1(Event):
    """A file the platform made for a tenant (today: a job's results CSV, OpenAI's `result_files`)."""

    EVENT_TYPE = "file.created"
    file_id: str
    purpose: Literal["fine-tune-results"] = "fine-tune-results"
    filename: str
    size_bytes: int = Field(ge=0)
    job_id: str | None = Field(default=None, description="the job the file belongs to")
    uri: str = Field(description="s3:// object holding the content")


# --------------------------------------------------------------------- jobs


class Hyperparameters(Contract):
    """User-facing knobs; None means 'choose the default for this model and method'."""

    n_epochs: int | None = Field(default=None, ge=1, le=100)
    learning_rate: float | None = Field(default=None, gt=0, le=1)
    batch_size: int | Literal["auto"] | None = Field(default=None, description="micro-batch, or 'auto'")
    gradient_accumulation_steps: int | None = Field(default=None, ge=1, le=1024)
    lora_r: int | None = Field(default=None, ge=1, le=1024)
    lora_alpha: int | None = Field(default=None, ge=1, le=4096)
    lora_dropout: float | None = Field(default=None, ge=0, lt=1)
    max_seq_len: int | None = Field(default=None, ge=16, le=131072)
    warmup_ratio: float | None = Field(default=None, ge=0, lt=1)
    seed: int | None = Field(default=None, ge=0)
    checkpoint_every_steps: int | None = Field(default=None, ge=1)
    checkpoint_every_minutes: float | None = Field(default=None, gt=0)
    target_effective_batch: int | None = Field(default=None, ge=1, le=65536)
    packing: bool | None = None
    lora_target_modules: list[Annotated[str, Field(max_length=128)]] | None = Field(default=None, max_length=64)
    merge_adapter: bool | None = None
    precompute_ref_log_probs: bool | None = None
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    beta: float | None = Field(default=None, gt=0, le=10, description="DPO beta / ORPO lambda")
    gradient_checkpointing: bool | None = Field(default=None, description="recompute activations (less memory); "
                                                "absent: admission decides from the GPU's memory")

    @field_validator("batch_size")
    @classmethod
    def _batch_size_range(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and not 1 <= v <= 4096:
            raise ValueError("batch_size must be between 1 and 4096, or 'auto'")
        return v


class ResourceRequest(Contract):
    """An explicit GPU request for a job; absent means "auto" (derived from model size and method)."""

    gpu_type: str = Field(min_length=1, max_length=64)
    gpus_per_node: int = Field(ge=1, le=64)
    nodes: int = Field(1, ge=1, le=64)


# a python grader's source may be 256 KiB (whetstone.graders); the grader JSON stays well under the
# bus's 1 MiB message
MAX_GRADER_JSON_BYTES = 512 * 1024
# a container image by digest, as a job pins its trainer image: name@sha256:<64 hex> (a tag is mutable)
IMAGE_PIN = r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$"
# JSON objects a job carries as OpenAI's API defines them, validated by the service that runs them
# (whetstone.graders for the grader and response format, the eval service for the gate settings)
GraderObject = Annotated[dict[str, Any], JsonAtMost(MAX_GRADER_JSON_BYTES)]
ResponseFormatObject = Annotated[dict[str, Any], JsonAtMost(16384)]
EvalConfigObject = Annotated[dict[str, Any], JsonAtMost(16384)]


class ReinforcementSpec(Contract):
    """A reinforcement fine-tuning job's method, resolved (`whetstone.graders.rft`): the grader as
    OpenAI's API defines it and every knob as a number."""

    grader: GraderObject = Field(
        description="the grader object (string_check, text_similarity, python, score_model or multi), validated")
    n_epochs: int = Field(ge=1, le=50)
    batch_size: int = Field(ge=1, le=256, description="prompts per optimiser step")
    learning_rate: float = Field(gt=0, le=1)
    generations: int = Field(ge=2, le=64, description="completions sampled per prompt (compute_multiplier)")
    eval_interval: int = Field(ge=1, description="optimiser steps between evaluations")
    eval_samples: int = Field(ge=1, le=16, description="completions per validation prompt at an evaluation")
    reasoning_effort: ReasoningEffort = ReasoningEffort.DEFAULT
    max_completion_tokens: int = Field(ge=1, le=32768, description="completion budget (reasoning_effort)")
    response_format: ResponseFormatObject | None = Field(
        default=None, description="json_schema the samples should follow")
    base_quantization: Literal["nf4"] | None = Field(
        default=None, description="QLoRA: the frozen base loaded in 4-bit NF4 (method.whetstone.method 'qlora')")


class JobRequestedV1(Event):
    EVENT_TYPE = "job.requested"
    job_id: str = Field(max_length=64, description="job_id_for(tenant_id, idempotency_key)")
    idempotency_key: str = Field(min_length=1, max_length=255)
    model: str = Field(min_length=1, max_length=256, description="base model: registry name, local directory or Hub id")
    training_file: str = Field(max_length=128, description="dataset_id of a validated dataset")
    validation_file: str | None = Field(default=None, max_length=128)
    method: Method = Method.LORA
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    suffix: str | None = Field(default=None, max_length=64)
    tier: str | None = Field(default=None, max_length=32)
    resources: ResourceRequest | None = Field(default=None, description="absent: auto")
    eval_config: EvalConfigObject | None = Field(
        default=None, max_length=32,
        description="per-job eval gate settings (stages, thresholds); absent: tenant defaults")
    reinforcement: ReinforcementSpec | None = Field(default=None, description="method reinforcement: grader, knobs")
    base_model_sha256: str | None = Field(
        default=None, max_length=64, pattern=r"^([0-9a-f]{40}|[0-9a-f]{64})$",
        description="pin (`whet jobs reproduce`): the sha256 of a catalog base's weights, or the Hub commit, the job"
                    " must train on; a catalog base that no longer hashes to it is refused; absent: the base as it is now")
    image: str | None = Field(
        default=None, max_length=300, pattern=IMAGE_PIN,
        description="pin (a job template's, kept by `whet jobs reproduce`): the trainer image by digest, "
                    "name@sha256:<64 hex>; only a trainer agent running that digest trains the job; absent: any")
    integrations: list[Integration] = Field(default_factory=list, max_length=8,
                                            description="experiment tracking the job asked for (OpenAI's shape)")


class MergeSource(Contract):
    """A merge job's input: a registered model's adapter, pinned by its manifest's sha256."""

    merge_id: str
    model_id: str
    adapter_uri: str = Field(description="s3:// prefix of the adapter artifact (manifest.json inside)")
    adapter_manifest_sha256: str
    source_job_id: str = Field(description="the training job that produced the adapter")


class TrainingSpec(Contract):
    """Everything a trainer needs to run the job, resolved by the scheduler."""

    base_model: str
    base_model_sha256: str
    dataset_id: str
    dataset_version: str
    train_uri: str
    validation_uri: str | None = None
    method: SpecMethod
    hyperparameters: dict[str, Any]
    hyperparameters_hash: str
    eval_config: dict[str, Any] | None = Field(default=None, description="the job's eval gate settings, as requested")
    merge: MergeSource | None = Field(default=None, description="method merge: the adapter to merge into the base")
    reinforcement: ReinforcementSpec | None = Field(default=None, description="method reinforcement: grader, knobs")
    image: str | None = Field(default=None, max_length=300, pattern=IMAGE_PIN,
                              description="the trainer image the job is pinned to (name@sha256:<64 hex>); absent: any")


class Resources(Contract):
    gpu_type: str
    gpus_per_node: int = Field(ge=1)
    nodes: int = Field(default=1, ge=1)


class JobQueuedV1(Event):
    EVENT_TYPE = "job.queued"
    job_id: str
    tier: str
    spec: TrainingSpec
    resources: Resources
    queue_position: int | None = None
    cost_estimate: CostEstimate | None = Field(default=None, description="the dataset's estimate with the job's"
                                               " estimated runtime and GPU-hours")
    requeued: bool = False
    suffix: str | None = Field(default=None, max_length=64, description="the user's suffix for the model name")
    job_template: str | None = Field(default=None, description="the job template the job was created from")
    job_template_version: str | None = Field(default=None, description="that template's version (a number)")
    job_template_overrides: list[str] = Field(default_factory=list,
                                              description="fields the job create set over the template's")
    integrations: list[Integration] = Field(default_factory=list, max_length=8,
                                            description="the job's experiment tracking (the registry logs to MLflow)")


class CheckpointRef(Contract):
    uri: str
    step: int
    manifest_sha256: str


class Rendezvous(GivenFieldsOnly):
    """Where the nodes of a multi-node gang meet: rank 0's address, this node's rank, the gang's size and
    every member's address by rank. Only the fields given are written back (an absent `master_port`:
    every node derives the same one from the segment id)."""

    master_addr: str = Field(min_length=1, max_length=256, description="node rank 0's address")
    node_rank: int = Field(default=0, ge=0, description="this node's rank in the gang")
    nodes: int = Field(ge=1, le=1024, description="how many nodes the gang has")
    hosts: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=1024, description="every member's address, by rank")
    master_port: int | None = Field(default=None, gt=0, lt=65536, description="absent: derived from the segment id")

    @model_validator(mode="after")
    def _ranks_fit_the_gang(self) -> Rendezvous:
        if self.node_rank >= self.nodes:
            raise ValueError(f"node_rank {self.node_rank} is not below nodes {self.nodes}")
        if self.hosts and len(self.hosts) != self.nodes:
            raise ValueError(f"hosts lists {len(self.hosts)} addresses for nodes {self.nodes}")
        return self


class JobAssignedV1(Event):
    EVENT_TYPE = "job.assigned"
    job_id: str
    node_id: str
    segment_id: str
    attempt: int = Field(ge=1)
    gpu_ids: list[int] = Field(default_factory=list)
    spec: TrainingSpec
    resume_from: CheckpointRef | None = None
    rendezvous: Rendezvous | None = Field(default=None, description="multi-node gangs only: where the nodes meet")


class JobCancelledV1(Event):
    """The scheduler accepted a cancel: the job's outcome is `cancelled`, whatever its nodes, eval or
    registry report afterwards. Every consumer voids the job (no step, checkpoint, verdict or model of
    it counts from now on); `attempt` says how many segments the job was ever assigned."""

    EVENT_TYPE = "job.cancelled"
    job_id: str
    node_id: str | None = None
    reason: str = "cancelled by user"
    attempt: int | None = Field(default=None, ge=0, description="the job's attempts assigned when it was cancelled"
                                " (0: never placed on a node); absent: older producer")


class NodeFencedV1(Event):
    """Command to a node: the scheduler declared it lost (or the segment timed out) and moved the
    job on; this attempt is fenced: stop it without reporting, every later event of it is refused."""

    EVENT_TYPE = "node.fenced"
    job_id: str
    node_id: str
    segment_id: str | None = None
    attempt: int = Field(ge=1, description="the fenced attempt; the job's next assignment has a higher one")
    reason: str = Field(description="node_lost | spot_loss | platform_timeout: why the scheduler moved on")


class JobPreemptRequestedV1(Event):
    """Command to the node: checkpoint this job now and stop (priority preemption, spot notice, drain)."""

    EVENT_TYPE = "job.preempt_requested"
    job_id: str
    node_id: str
    segment_id: str | None = None
    reason: PreemptRequestReason
    for_job_id: str | None = None


class JobStartedV1(Event):
    EVENT_TYPE = "job.started"
    job_id: str
    node_id: str
    segment_id: str
    attempt: int
    gpu_type: str
    gpu_count: int
    spot: bool = False
    started_at: datetime
    total_steps: int | None = None
    resumed_from_step: int | None = None


class JobProgressV1(Event):
    EVENT_TYPE = "job.progress"
    job_id: str
    segment_id: str
    attempt: int | None = Field(default=None, ge=1, description="job attempt of the segment (fencing); absent: older producer")
    step: int
    total_steps: int | None = None
    epoch: float | None = None
    loss: float | None = None
    grad_norm: float | None = None
    learning_rate: float | None = None
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    peak_memory_mb: float | None = None
    validation_loss: float | None = None
    tokens_seen: int | None = None
    token_accuracy: float | None = None
    gpu_utilization: float | None = None
    step_time_s: float | None = Field(default=None, ge=0, description="mean wall time per optimizer step since the last report")
    mfu: float | None = Field(default=None, ge=0, description="model FLOPs utilisation: 6 * params * tokens/s over the"
                              " GPUs' peak bf16 FLOP/s; absent on CPU or an unknown GPU type")


class CheckpointWrittenV1(Event):
    EVENT_TYPE = "checkpoint.written"
    job_id: str
    segment_id: str
    attempt: int | None = Field(default=None, ge=1, description="job attempt of the segment (fencing); absent: older producer")
    checkpoint_id: str
    kind: CheckpointKind
    step: int
    uri: str = Field(description="s3:// prefix holding the files and manifest.json")
    manifest_sha256: str
    files: int
    size_bytes: int
    written_at: datetime
    metrics: dict[str, float] = Field(default_factory=dict, description="e.g. validation_loss at this step")


class JobPreemptedV1(Event):
    EVENT_TYPE = "job.preempted"
    job_id: str
    segment_id: str
    attempt: int | None = Field(default=None, ge=1, description="job attempt of the segment (fencing); absent: older producer")
    node_id: str
    reason: PreemptionReason
    stopped_at: datetime
    checkpoint: CheckpointRef | None = None
    checkpointed_at: datetime | None = None


class JobCompletedV1(Event):
    EVENT_TYPE = "job.completed"
    job_id: str
    segment_id: str
    attempt: int | None = Field(default=None, ge=1, description="job attempt of the segment (fencing); absent: older producer")
    node_id: str
    stopped_at: datetime
    steps: int
    train_loss: float | None = None
    tokens: int | None = None
    final_checkpoint: CheckpointRef
    metrics: dict[str, Any] = Field(default_factory=dict)


class JobFailedV1(Event):
    EVENT_TYPE = "job.failed"
    job_id: str
    error_class: ErrorClass
    code: str
    message: str
    segment_id: str | None = None
    node_id: str | None = None
    stopped_at: datetime | None = None
    advice: list[str] = Field(default_factory=list)
    attempt: int | None = Field(default=None, ge=1, description="job attempt of the segment (fencing); absent: older producer")

