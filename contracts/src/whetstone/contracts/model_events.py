"""Events of evaluation and the model registry: verdicts, registrations, stage changes, base-model
versions, re-evaluation and merge commands."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from .base import Contract, Event
from .enums import Approval, EvalReason, EvalVerdict, MergeStatus, ModelStage, StageStatus

# -------------------------------------------------------------- eval, models


class Metric(Contract):
    name: str
    base: float | None = None
    candidate: float
    last_accepted: float | None = None
    higher_is_better: bool = False


class EvalStageResult(Contract):
    """One stage of the eval gate: benchmarks, holdout, safety, judge (or another named stage)."""

    name: str
    status: StageStatus
    reason: str = Field(description="one line saying why")
    metrics: list[Metric] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)


class EvalCompletedV1(Event):
    EVENT_TYPE = "eval.completed"
    job_id: str
    checkpoint_uri: str
    verdict: EvalVerdict
    reasons: list[str]
    metrics: list[Metric]
    stages: list[EvalStageResult] = Field(default_factory=list, description="per-stage results; verdict = all enabled stages passed")
    request_id: str | None = Field(
        default=None, description="set when answering an eval.requested command (e.g. a re-eval after a base-model"
                                  " update): the command's request_id")
    base_model_sha256: str | None = Field(default=None, description="the base-model SHA the candidate was evaluated on")


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
    eval_stages: list[EvalStageResult] = Field(default_factory=list, description="per-stage eval results")
    training_run: str | None = Field(default=None, description="segment id of the run that wrote the final checkpoint")
    checkpoint_step: int | None = None
    job_template: str | None = Field(default=None, description="job template name; null until templates exist")
    job_template_version: str | None = None
    chat_template_sha256: str | None = Field(
        default=None, description="sha256 of the chat template used in training (serving must use the same)")
    environment_sha256: str | None = Field(default=None, description="sha256 of the environment lockfile")


class ModelRegisteredV1(Event):
    EVENT_TYPE = "model.registered"
    model_id: str
    name: str
    stage: ModelStage
    fine_tuned_model: str | None = Field(
        default=None, description="the version's public id (OpenAI's fine_tuned_model, naming.fine_tuned_model_for);"
        " absent: an older producer, the model_id is its id")
    artifact_uri: str
    artifact_sha256: str = Field(description="sha256 of the artifact's manifest.json")
    lineage: Lineage
    files: dict[str, str] = Field(default_factory=dict, description="artifact file (relative path) -> sha256")
    model_card_uri: str | None = None


class ModelPromotedV1(Event):
    """A stage change (serving handoff). Carries everything a loader needs to act on it alone."""

    EVENT_TYPE = "model.promoted"
    model_id: str
    from_stage: str
    to_stage: str
    reason: str
    name: str | None = None
    fine_tuned_model: str | None = Field(default=None, description="the version's public id (see ModelRegisteredV1)")
    artifact_uri: str | None = None
    artifact_sha256: str | None = Field(default=None, description="sha256 of the artifact's manifest.json")
    files: dict[str, str] = Field(default_factory=dict, description="artifact file (relative path) -> sha256")
    base_model: str | None = None
    base_model_sha256: str | None = None
    chat_template_sha256: str | None = None
    approval: Approval | None = Field(
        default=None, description="how a promotion to production was approved; None for other transitions")
    approved_by: str | None = Field(default=None, description="key id of the approving caller (manual)")
    replaces_model_id: str | None = Field(
        default=None, description="the production version this one replaces (archived in the same transaction)")
    sequence: int | None = Field(default=None, description="the stage-history row id: orders transitions")


class BaseModelUpdatedV1(Event):
    """A new pinned SHA for a catalog base model: adapters on the previous SHA need re-evaluation."""

    EVENT_TYPE = "base_model.updated"
    name: str
    sha256: str
    previous_sha256: str | None = None
    uri: str | None = Field(default=None, description="where the new weights are (local dir, s3:// or Hub id)")
    reason: str = ""


class EvalRequestedV1(Event):
    """Command to the eval service: run the gate for a registered model (against `base_model_sha256`),
    answer with eval.completed carrying `request_id` and `base_model_sha256`."""

    EVENT_TYPE = "eval.requested"
    request_id: str
    job_id: str
    model_id: str
    checkpoint_uri: str = Field(description="the model's artifact prefix (manifest.json inside)")
    manifest_sha256: str
    base_model: str
    base_model_sha256: str = Field(description="the SHA to evaluate against (the new one)")
    base_model_uri: str | None = None
    previous_base_model_sha256: str | None = None
    reason: EvalReason = EvalReason.BASE_MODEL_UPDATED
    eval_config: dict[str, Any] | None = Field(default=None, description="the job's eval gate settings, if any")


class MergeRequestedV1(Event):
    """Command: merge a model's adapter into its base (a job through the normal queue, billed as one)."""

    EVENT_TYPE = "model.merge_requested"
    merge_id: str
    model_id: str
    job_id: str = Field(description="the training job of the adapter")
    artifact_uri: str
    manifest_sha256: str
    base_model: str
    base_model_sha256: str


class ModelMergedV1(Event):
    """Answer to model.merge_requested: merged full weights (safetensors) stored with a manifest."""

    EVENT_TYPE = "model.merged"
    merge_id: str
    model_id: str
    status: MergeStatus
    uri: str | None = None
    manifest_sha256: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    merge_job_id: str | None = Field(default=None, description="the job that did the merge (billing)")
    error: str | None = None
