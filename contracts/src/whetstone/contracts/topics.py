"""The topic table: topic -> payload model, key field, partitions."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from . import events as e
from . import model_events as m
from . import platform_events as p
from .base import Event

DLQ_SUFFIX = ".dlq"


@dataclass(frozen=True)
class Topic:
    name: str
    model: type[Event]
    key_field: str
    partitions: int = 3
    # how long the broker keeps messages (production KafkaTopic retention.ms); DLQs keep theirs longer
    retention_hours: int = 7 * 24
    dlq_retention_hours: int = 30 * 24

    @property
    def dlq(self) -> str:
        return self.name + DLQ_SUFFIX


TOPICS: dict[str, Topic] = {
    t.name: t
    for t in [
        Topic("dataset.submitted", e.DatasetSubmittedV1, "dataset_id"),
        Topic("dataset.validated", e.DatasetValidatedV1, "dataset_id"),
        Topic("dataset.deleted", e.DatasetDeletedV1, "dataset_id"),
        Topic("file.created", e.FileCreatedV1, "file_id"),
        Topic("job.requested", e.JobRequestedV1, "job_id"),
        Topic("job.queued", e.JobQueuedV1, "job_id"),
        Topic("job.assigned", e.JobAssignedV1, "node_id"),
        Topic("job.cancelled", e.JobCancelledV1, "job_id"),
        Topic("job.preempt_requested", e.JobPreemptRequestedV1, "node_id"),
        Topic("node.fenced", e.NodeFencedV1, "node_id"),
        Topic("job.started", e.JobStartedV1, "job_id"),
        Topic("job.progress", e.JobProgressV1, "job_id"),
        Topic("checkpoint.written", e.CheckpointWrittenV1, "job_id"),
        Topic("job.preempted", e.JobPreemptedV1, "job_id"),
        Topic("job.completed", e.JobCompletedV1, "job_id"),
        Topic("job.failed", e.JobFailedV1, "job_id"),
        Topic("eval.completed", m.EvalCompletedV1, "job_id"),
        Topic("model.registered", m.ModelRegisteredV1, "model_id"),
        Topic("model.promoted", m.ModelPromotedV1, "model_id"),
        Topic("base_model.updated", m.BaseModelUpdatedV1, "name"),
        Topic("eval.requested", m.EvalRequestedV1, "job_id"),
        Topic("model.merge_requested", m.MergeRequestedV1, "model_id"),
        Topic("model.merged", m.ModelMergedV1, "model_id"),
        Topic("usage.metered", p.UsageMeteredV1, "job_id"),
        Topic("node.heartbeat", p.NodeHeartbeatV1, "node_id", partitions=1),
    ]
}

EVENT_MODELS: dict[str, type[Event]] = {t.model.EVENT_TYPE: t.model for t in TOPICS.values()}
DLQ_MODEL = p.DeadLetterV1


def topic_for(model: type[Event] | Event) -> Topic:
    return TOPICS[model.EVENT_TYPE]


def all_topic_partitions() -> list[tuple[str, int]]:
    """Every topic and its dead-letter topic, for explicit creation at start-up."""
    out: list[tuple[str, int]] = []
    for t in TOPICS.values():
        out += [(t.name, t.partitions), (t.dlq, 1)]
    return out


def job_id_for(tenant_id: str, idempotency_key: str) -> str:
    """The job id is derived from the tenant and the idempotency key, so a retried
    request lands on the same job whichever entry point (HTTP or Kafka) it used."""
    digest = hashlib.sha256(f"{tenant_id}\x00{idempotency_key}".encode()).hexdigest()
    return "ftjob-" + digest[:24]


def dataset_id_for(content_sha256: str) -> str:
    """Datasets are content-addressed: identical bytes give the same id."""
    return "ds-" + content_sha256[:24]
