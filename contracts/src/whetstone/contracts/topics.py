"""The topic table: topic -> payload model, key field, partitions, and which services produce and
consume it. deploy/tools/kafka_resources.py makes each service's Kafka ACLs from this table alone;
tests/ops/test_topic_owners.py checks that the services' code matches it (a service consumes exactly
the topics it subscribes to, and constructs only the events of topics it produces)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from . import events as e
from . import model_events as m
from . import platform_events as p
from .base import Event
from .enums import ServiceName

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
    producers: frozenset[ServiceName] = frozenset()
    consumers: frozenset[ServiceName] = frozenset()

    @property
    def dlq(self) -> str:
        return self.name + DLQ_SUFFIX


_INGEST, _SCHEDULER, _AGENT, _EVAL = ServiceName.INGEST, ServiceName.SCHEDULER, ServiceName.TRAINER_AGENT, ServiceName.EVAL
_REGISTRY, _METERING, _SERVING, _EXTERNAL = (ServiceName.REGISTRY, ServiceName.METERING, ServiceName.SERVING,
                                             ServiceName.EXTERNAL)


def _by(*services: ServiceName) -> frozenset[ServiceName]:
    return frozenset(services)


# The job lifecycle topics metering settles from. A metering replica owns the jobs of the partition
# numbers it holds of all of them, so they share one count, keyed by job id; 6 splits evenly between
# 2 or 3 replicas (deploy/base runs 2), where 3 would leave one of 2 replicas half as busy.
LIFECYCLE_PARTITIONS = 6


TOPICS: dict[str, Topic] = {
    t.name: t
    for t in [
        Topic("dataset.submitted", e.DatasetSubmittedV1, "dataset_id", producers=_by(_INGEST),
              consumers=_by(_INGEST, _SCHEDULER)),
        Topic("dataset.validated", e.DatasetValidatedV1, "dataset_id", producers=_by(_INGEST),
              consumers=_by(_SCHEDULER)),
        Topic("dataset.deleted", e.DatasetDeletedV1, "dataset_id", producers=_by(_INGEST),
              consumers=_by(_SCHEDULER)),
        Topic("file.created", e.FileCreatedV1, "file_id", producers=_by(_INGEST),
              consumers=_by(_SCHEDULER)),
        Topic("job.requested", e.JobRequestedV1, "job_id", producers=_by(_SCHEDULER, _EXTERNAL),
              consumers=_by(_SCHEDULER)),
        Topic("job.queued", e.JobQueuedV1, "job_id", partitions=LIFECYCLE_PARTITIONS,
              producers=_by(_SCHEDULER),
              consumers=_by(_EVAL, _INGEST, _METERING, _REGISTRY)),
        Topic("job.assigned", e.JobAssignedV1, "node_id", producers=_by(_SCHEDULER),
              consumers=_by(_AGENT)),
        Topic("job.cancelled", e.JobCancelledV1, "job_id", partitions=LIFECYCLE_PARTITIONS,
              producers=_by(_SCHEDULER),
              consumers=_by(_EVAL, _INGEST, _METERING, _REGISTRY, _AGENT)),
        Topic("job.preempt_requested", e.JobPreemptRequestedV1, "node_id", producers=_by(_SCHEDULER),
              consumers=_by(_AGENT)),
        Topic("node.fenced", e.NodeFencedV1, "node_id", producers=_by(_SCHEDULER),
              consumers=_by(_EVAL, _REGISTRY, _AGENT)),
        Topic("job.started", e.JobStartedV1, "job_id", partitions=LIFECYCLE_PARTITIONS,
              producers=_by(_AGENT),
              consumers=_by(_METERING, _SCHEDULER)),
        Topic("job.progress", e.JobProgressV1, "job_id", producers=_by(_AGENT),
              consumers=_by(_INGEST, _REGISTRY, _SCHEDULER)),
        Topic("checkpoint.written", e.CheckpointWrittenV1, "job_id", producers=_by(_AGENT),
              consumers=_by(_EVAL, _INGEST, _REGISTRY, _SCHEDULER, _SERVING)),
        Topic("job.preempted", e.JobPreemptedV1, "job_id", partitions=LIFECYCLE_PARTITIONS,
              producers=_by(_SCHEDULER, _AGENT),
              consumers=_by(_METERING, _SCHEDULER)),
        Topic("job.completed", e.JobCompletedV1, "job_id", partitions=LIFECYCLE_PARTITIONS,
              producers=_by(_AGENT),
              consumers=_by(_INGEST, _METERING, _SCHEDULER)),
        Topic("job.failed", e.JobFailedV1, "job_id", partitions=LIFECYCLE_PARTITIONS,
              producers=_by(_SCHEDULER, _AGENT),
              consumers=_by(_INGEST, _METERING, _REGISTRY, _SCHEDULER)),
        Topic("eval.completed", m.EvalCompletedV1, "job_id", producers=_by(_EVAL),
              consumers=_by(_REGISTRY, _SCHEDULER)),
        Topic("model.registered", m.ModelRegisteredV1, "model_id", producers=_by(_REGISTRY),
              consumers=_by(_SCHEDULER, _SERVING)),
        Topic("model.promoted", m.ModelPromotedV1, "model_id", producers=_by(_REGISTRY),
              consumers=_by(_SCHEDULER, _SERVING)),
        Topic("base_model.updated", m.BaseModelUpdatedV1, "name", producers=_by(_REGISTRY),
              consumers=_by()),
        Topic("eval.requested", m.EvalRequestedV1, "job_id", producers=_by(_REGISTRY),
              consumers=_by(_EVAL)),
        Topic("model.merge_requested", m.MergeRequestedV1, "model_id", producers=_by(_REGISTRY),
              consumers=_by(_SCHEDULER)),
        Topic("model.merged", m.ModelMergedV1, "model_id", producers=_by(_SCHEDULER, _AGENT),
              consumers=_by(_REGISTRY)),
        Topic("usage.metered", p.UsageMeteredV1, "job_id", producers=_by(_METERING),
              consumers=_by(_SCHEDULER)),
        Topic("node.heartbeat", p.NodeHeartbeatV1, "node_id", partitions=1,
              producers=_by(_AGENT),
              consumers=_by(_SCHEDULER)),
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
