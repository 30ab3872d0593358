"""Experiment tracking (a job's `mlflow` integration): what of a job's events becomes MLflow params, metrics,
tags and artifacts. Pure: the registry's use cases queue these batches, an adapter sends them."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field

from whetstone.contracts import EvalCompletedV1, JobProgressV1, JobQueuedV1
from whetstone.contracts.enums import IntegrationType
from whetstone.contracts.integrations import MlflowIntegration

# MLflow's limits (a param value of at most 6000 characters, a key of at most 250; a log-batch of at most
# 100 params, 100 tags and 1000 metrics)
MAX_PARAM_VALUE = 6000
MAX_KEY = 250
MAX_TAG_VALUE = 5000
BATCH_PARAMS, BATCH_TAGS, BATCH_METRICS = 100, 100, 1000
JOB_TAG = "whetstone.job_id"

# job.progress field -> metric key: OpenAI's results-file names where it has one, the platform's otherwise
PROGRESS_METRICS = {
    "loss": "train_loss", "validation_loss": "valid_loss", "token_accuracy": "train_mean_token_accuracy",
    "learning_rate": "learning_rate", "grad_norm": "grad_norm", "epoch": "epoch", "tokens_per_s": "tokens_per_s",
    "samples_per_s": "samples_per_s", "peak_memory_mb": "peak_memory_mb", "step_time_s": "step_time_s", "mfu": "mfu",
}


class RunStatus(StrEnum):
    """MLflow's run statuses the tracker ends a run with."""

    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"


class Param(BaseModel):
    key: str
    value: str


class Tag(BaseModel):
    key: str
    value: str


class MetricPoint(BaseModel):
    key: str
    value: float
    timestamp: int   # ms since the epoch: the event's time, so a replayed point is the same point
    step: int


class Artifact(BaseModel):
    path: str                 # inside the run's artifacts, e.g. model_card/README.md
    source_uri: str           # the object-store file the registry wrote
    content_type: str


class TrackingItem(BaseModel):
    """One thing to send to the job's run: a log-batch, an artifact, or the run's end."""

    params: list[Param] = Field(default_factory=list)
    tags: list[Tag] = Field(default_factory=list)
    metrics: list[MetricPoint] = Field(default_factory=list)
    artifact: Artifact | None = None
    end: RunStatus | None = None
    end_time: int | None = None


def mlflow_settings(ev: JobQueuedV1) -> MlflowIntegration | None:
    """The job's `mlflow` integration, if it asked for one."""
    return next((i.mlflow for i in ev.integrations if i.type == IntegrationType.MLFLOW and i.mlflow), None)


def experiment_for(tenant_id: str, settings: MlflowIntegration) -> str:
    """The experiment on the operator's server: under the tenant's name, so tenants never share one."""
    return f"{tenant_id}/{settings.experiment_name}"


def millis(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _param(key: str, value: object) -> Param:
    return Param(key=key[:MAX_KEY], value=str(value)[:MAX_PARAM_VALUE])


def params_of(ev: JobQueuedV1) -> TrackingItem:
    """The run's params: the base (and its pin), the files, the method and every resolved hyperparameter."""
    spec = ev.spec
    fixed = {"base_model": spec.base_model, "base_model_sha256": spec.base_model_sha256, "method": spec.method,
             "training_file": spec.dataset_id, "dataset_version": spec.dataset_version,
             "validation_file": spec.validation_uri or "", "hyperparameters_hash": spec.hyperparameters_hash,
             "tier": ev.tier, "suffix": ev.suffix or "", "gpu_type": ev.resources.gpu_type,
             "gpus": ev.resources.gpus_per_node * ev.resources.nodes}
    params = [_param(k, v) for k, v in fixed.items()]
    params += [_param(f"hp.{k}", v) for k, v in sorted(spec.hyperparameters.items()) if v is not None]
    return TrackingItem(params=params, tags=[Tag(key=JOB_TAG, value=ev.job_id)])


def metrics_of(ev: JobProgressV1, at: datetime) -> TrackingItem:
    """One optimizer step's figures, keyed by the step."""
    points = [MetricPoint(key=key, value=float(value), timestamp=millis(at), step=ev.step)
              for field, key in PROGRESS_METRICS.items() if (value := getattr(ev, field)) is not None]
    return TrackingItem(metrics=points)


def verdict_of(ev: EvalCompletedV1, at: datetime, step: int) -> TrackingItem:
    """The gate's verdict as tags, and each gate metric (candidate, and the base where measured) at `step`."""
    tags = [Tag(key="eval.verdict", value=str(ev.verdict)),
            Tag(key="eval.reasons", value="; ".join(ev.reasons)[:MAX_TAG_VALUE] or "none given")]
    points: list[MetricPoint] = []
    for m in ev.metrics:
        points.append(MetricPoint(key=f"eval.{m.name}"[:MAX_KEY], value=m.candidate, timestamp=millis(at), step=step))
        if m.base is not None:
            points.append(MetricPoint(key=f"eval.base.{m.name}"[:MAX_KEY], value=m.base, timestamp=millis(at),
                                      step=step))
    return TrackingItem(tags=tags, metrics=points)


def registered(card_uri: str, model_id: str, fine_tuned_model: str, at: datetime) -> list[tuple[str, TrackingItem]]:
    """A registered model: its names as tags, its model card as an artifact, and the run's end."""
    names = TrackingItem(tags=[Tag(key="whetstone.model_id", value=model_id),
                               Tag(key="whetstone.fine_tuned_model", value=fine_tuned_model)])
    card = TrackingItem(artifact=Artifact(path="model_card/README.md", source_uri=card_uri,
                                          content_type="text/markdown"))
    return [("model", names), ("card", card), ("end", ended(RunStatus.FINISHED, at))]


def ended(status: RunStatus, at: datetime) -> TrackingItem:
    return TrackingItem(end=status, end_time=millis(at))


def batches(item: TrackingItem) -> list[TrackingItem]:
    """An item's params/tags/metrics split into log-batches MLflow takes."""
    out: list[TrackingItem] = []
    p, t, m = item.params, item.tags, item.metrics
    while p or t or m:
        out.append(TrackingItem(params=p[:BATCH_PARAMS], tags=t[:BATCH_TAGS], metrics=m[:BATCH_METRICS]))
        p, t, m = p[BATCH_PARAMS:], t[BATCH_TAGS:], m[BATCH_METRICS:]
    return out


def retry_delay_s(attempts: int, base_s: float, cap_s: float = 300.0) -> float:
    """Backoff after `attempts` failed tries in a row: base, 2x base, 4x ... at most `cap_s`."""
    return float(min(cap_s, base_s * 2 ** max(0, attempts - 1)))
