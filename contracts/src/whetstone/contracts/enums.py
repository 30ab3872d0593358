"""The shared vocabularies of the wire contract, as StrEnums.

A member compares equal to its string and serialises as that string, so the JSON on the wire is the
same whether a producer passes `Method.LORA` or `"lora"`.
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    """A fine-tuning job's status: OpenAI's (validating_files, queued, running, paused, succeeded,
    failed, cancelled) plus the platform's own steps between them."""

    VALIDATING_FILES = "validating_files"
    QUEUED = "queued"
    PROVISIONING = "provisioning"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    EVALUATING = "evaluating"
    PREEMPTED = "preempted"
    PAUSED = "paused"            # stopped by its tenant (POST .../pause): off every node, out of the queue
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Purpose(StrEnum):
    """What a dataset is for."""

    SFT = "sft"
    DPO = "dpo"
    CPT = "cpt"
    EVAL = "eval"
    RFT = "rft"


class Method(StrEnum):
    """A training method a tenant may request."""

    LORA = "lora"
    QLORA = "qlora"
    FULL = "full"
    DPO = "dpo"
    ORPO = "orpo"
    CPT = "cpt"
    REINFORCEMENT = "reinforcement"


class SpecMethod(StrEnum):
    """A job's resolved method: every `Method`, plus the platform's own merge job (an adapter merged
    into its base on request: POST /v1/models/{id}/merged)."""

    LORA = "lora"
    QLORA = "qlora"
    FULL = "full"
    DPO = "dpo"
    ORPO = "orpo"
    CPT = "cpt"
    REINFORCEMENT = "reinforcement"
    MERGE = "merge"


class ErrorClass(StrEnum):
    """Whose fault a failure is: decides the charge (user: charged, platform: refunded, ambiguous: review)."""

    USER = "user"
    PLATFORM = "platform"
    AMBIGUOUS = "ambiguous"


class CheckpointKind(StrEnum):
    PERIODIC = "periodic"
    EMERGENCY = "emergency"
    FINAL = "final"


class DatasetStatus(StrEnum):
    """The validation outcome of a dataset."""

    ACCEPTED = "accepted"
    REJECTED = "rejected"


class ModelStage(StrEnum):
    """A registered model version's lifecycle stage."""

    DEV = "dev"
    STAGING = "staging"
    PRODUCTION = "production"
    ARCHIVED = "archived"
    QUARANTINED = "quarantined"


class EvalVerdict(StrEnum):
    """The eval gate's verdict on a candidate."""

    PASSED = "passed"
    FAILED = "failed"


class StageStatus(StrEnum):
    """The outcome of one stage of the eval gate."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


class EvalReason(StrEnum):
    """Why the eval service was asked to evaluate a registered model."""

    BASE_MODEL_UPDATED = "base_model_updated"
    MANUAL = "manual"


class Approval(StrEnum):
    """How a promotion to production was approved."""

    MANUAL = "manual"
    AUTO = "auto"


class MergeStatus(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ChargeClass(StrEnum):
    """How a job's GPU time is billed."""

    CHARGED = "charged"
    REFUNDED = "refunded"
    REVIEW = "review"


class UsageScope(StrEnum):
    SEGMENT = "segment"
    JOB = "job"


class PreemptRequestReason(StrEnum):
    """Why the scheduler asks a node to checkpoint a job and stop."""

    PRIORITY = "priority"
    SPOT_LOSS = "spot_loss"
    DRAIN = "drain"
    PAUSE = "pause"          # the tenant paused the job: it is parked, not re-queued


class PreemptionReason(StrEnum):
    """Why a job's segment stopped before the job ended."""

    SPOT_LOSS = "spot_loss"
    PRIORITY = "priority"
    NODE_LOST = "node_lost"
    DRAIN = "drain"
    SIGNAL = "signal"
    PLATFORM_TIMEOUT = "platform_timeout"
    PAUSE = "pause"          # the tenant paused the job (POST .../pause)


class ReasoningEffort(StrEnum):
    DEFAULT = "default"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class ValueEncoding(StrEnum):
    """How a dead letter carries the original record."""

    UTF8 = "utf-8"
    BASE64 = "base64"


class IntegrationType(StrEnum):
    """A job create's `integrations[i].type`: OpenAI's `wandb`, and the platform's `mlflow`."""

    WANDB = "wandb"
    MLFLOW = "mlflow"


class ServiceName(StrEnum):
    """Who produces and consumes each topic (`topics.TOPICS`): the platform's services, and EXTERNAL,
    a tenant's own producer of `job.requested` (authenticated by its producer token)."""

    INGEST = "ingest"
    SCHEDULER = "scheduler"
    TRAINER_AGENT = "trainer-agent"
    EVAL = "eval"
    REGISTRY = "registry"
    METERING = "metering"
    SERVING = "serving"
    EXTERNAL = "external"
