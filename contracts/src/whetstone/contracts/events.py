"""One versioned pydantic model per event of the topic table (DESIGN.md §2)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator

from .base import Contract, Event

Purpose = Literal["sft", "dpo", "cpt", "eval"]
Method = Literal["lora", "qlora", "full", "dpo", "orpo", "cpt"]
ErrorClass = Literal["user", "platform", "ambiguous"]
CheckpointKind = Literal["periodic", "emergency", "final"]


# ----------------------------------------------------------------- datasets


class ValidationIssue(Contract):
    code: str
    message: str
    line: int | None = None
    field: str | None = None


class DatasetSubmittedV1(Event):
    EVENT_TYPE = "dataset.submitted"
    dataset_id: str = Field(description="content address of the raw upload: ds-<sha256 prefix>")
    name: str
    source_uri: str = Field(description="s3://bucket/key of the raw upload, under the tenant's prefix")
    purpose: Purpose = "sft"
    base_model: str | None = None
    size_bytes: int | None = None


class DatasetValidatedV1(Event):
    EVENT_TYPE = "dataset.validated"
    dataset_id: str
    version: str = Field(description="sha256 of the raw content")
    name: str
    status: Literal["accepted", "rejected"]
    purpose: Purpose = "sft"
    format: str | None = None
    data_schema: str | None = None
    rows_total: int = 0
    rows_kept: int = 0
    tokens_total: int | None = None
    errors: list[ValidationIssue] = Field(default_factory=list)
    error_count: int = 0
    warnings: list[ValidationIssue] = Field(default_factory=list)
    stats: dict[str, Any] = Field(default_factory=dict)
    policies: dict[str, str] = Field(default_factory=dict)
    raw_uri: str | None = None
    train_uri: str | None = None
    validation_uri: str | None = None
    report_uri: str | None = None
    cost_estimate: dict[str, Any] | None = None


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
    lora_target_modules: list[str] | None = None
    merge_adapter: bool | None = None
    precompute_ref_log_probs: bool | None = None
    zero_stage: int | None = Field(default=None, ge=0, le=3)

    @field_validator("batch_size")
    @classmethod
    def _batch_size_range(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and not 1 <= v <= 4096:
            raise ValueError("batch_size must be between 1 and 4096, or 'auto'")
        return v


class ResourceRequest(Contract):
    """An explicit GPU request for a job; absent means "auto" (derived from model size and method)."""

    gpu_type: str = Field(min_length=1)
    gpus_per_node: int = Field(ge=1, le=64)
    nodes: int = Field(1, ge=1, le=64)


class JobRequestedV1(Event):
    EVENT_TYPE = "job.requested"
    job_id: str = Field(description="job_id_for(tenant_id, idempotency_key)")
    idempotency_key: str = Field(min_length=1, max_length=255)
    model: str = Field(min_length=1, description="base model: registry name, local directory or Hub id")
    training_file: str = Field(description="dataset_id of a validated dataset")
    validation_file: str | None = None
    method: Method = "lora"
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    suffix: str | None = Field(default=None, max_length=64)
    tier: str | None = None
    resources: ResourceRequest | None = Field(default=None, description="absent: auto")


class TrainingSpec(Contract):
    """Everything a trainer needs to run the job, resolved by the scheduler."""

    base_model: str
    base_model_sha256: str
    dataset_id: str
    dataset_version: str
    train_uri: str
    validation_uri: str | None = None
    method: Method
    hyperparameters: dict[str, Any]
    hyperparameters_hash: str


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
    cost_estimate: dict[str, Any] | None = None
    requeued: bool = False


class CheckpointRef(Contract):
    uri: str
    step: int
    manifest_sha256: str


class JobAssignedV1(Event):
    EVENT_TYPE = "job.assigned"
    job_id: str
    node_id: str
    segment_id: str
    attempt: int = Field(ge=1)
    gpu_ids: list[int] = Field(default_factory=list)
    spec: TrainingSpec
    resume_from: CheckpointRef | None = None
    rendezvous: dict[str, Any] | None = Field(
        default=None, description="multi-node gangs: master_addr (rank 0's address), node_rank, nodes, hosts"
                                  " (every member's address, by rank), optional master_port (absent: every"
                                  " node derives the same one from the segment id)")


class JobCancelledV1(Event):
    EVENT_TYPE = "job.cancelled"
    job_id: str
    node_id: str | None = None
    reason: str = "cancelled by user"


class JobPreemptRequestedV1(Event):
    """Command to the node: checkpoint this job now and stop (priority preemption, spot notice, drain)."""

    EVENT_TYPE = "job.preempt_requested"
    job_id: str
    node_id: str
    segment_id: str | None = None
    reason: Literal["priority", "spot_loss", "drain"]
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


class CheckpointWrittenV1(Event):
    EVENT_TYPE = "checkpoint.written"
    job_id: str
    segment_id: str
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
    node_id: str
    reason: Literal["spot_loss", "priority", "node_lost", "drain", "signal"]
    stopped_at: datetime
    checkpoint: CheckpointRef | None = None
    checkpointed_at: datetime | None = None


class JobCompletedV1(Event):
    EVENT_TYPE = "job.completed"
    job_id: str
    segment_id: str
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


# -------------------------------------------------------------- eval, models


class Metric(Contract):
    name: str
    base: float | None = None
    candidate: float
    last_accepted: float | None = None
    higher_is_better: bool = False


class EvalCompletedV1(Event):
    EVENT_TYPE = "eval.completed"
    job_id: str
    checkpoint_uri: str
    verdict: Literal["passed", "failed"]
    reasons: list[str]
    metrics: list[Metric]


class Lineage(Contract):
    job_id: str
    base_model: str
    base_model_sha256: str
    dataset_id: str
    dataset_version: str
    method: str
    hyperparameters_hash: str
    eval_verdict: str | None = None
    eval_metrics: list[Metric] = Field(default_factory=list)


class ModelRegisteredV1(Event):
    EVENT_TYPE = "model.registered"
    model_id: str
    name: str
    stage: Literal["dev", "staging", "production", "archived", "quarantined"]
    artifact_uri: str
    artifact_sha256: str
    lineage: Lineage


class ModelPromotedV1(Event):
    EVENT_TYPE = "model.promoted"
    model_id: str
    from_stage: str
    to_stage: str
    reason: str


# ------------------------------------------------------------------ metering


class UsageMeteredV1(Event):
    EVENT_TYPE = "usage.metered"
    job_id: str
    scope: Literal["segment", "job"]
    segment_id: str | None = None
    gpu_type: str | None = None
    gpu_count: int = 0
    gpu_seconds: float
    billable_gpu_seconds: float
    charge_class: Literal["charged", "refunded", "review"]
    price_version: str
    cost: float
    currency: str = "USD"
    segments: int = 1


# --------------------------------------------------------------------- nodes


class NodeHeartbeatV1(Event):
    EVENT_TYPE = "node.heartbeat"
    node_id: str
    gpu_type: str
    gpu_count: int = Field(ge=0)
    gpu_memory_gb: float = 0
    free_gpu_ids: list[int] = Field(default_factory=list)
    spot: bool = False
    interconnect_group: str = "default"
    running_jobs: list[str] = Field(default_factory=list)
    sent_at: datetime
    address: str | None = Field(
        default=None, description="host name or IP the other nodes of a multi-node gang reach this node at"
                                  " (rank 0 hosts the rendezvous); the node_id when absent")


# ---------------------------------------------------------------------- dlq


class DeadLetterV1(Event):
    EVENT_TYPE = "dead_letter"
    source_topic: str
    partition: int
    offset: int
    consumer: str
    attempts: int
    error: str
    key: str | None = None
    value: str = Field(description="the original message bytes, utf-8 with replacement")
