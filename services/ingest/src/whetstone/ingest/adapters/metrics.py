"""Metrics ingest derives from the validation outcomes it publishes (served on /metrics through the
runtime's Observer: `Service(event_metrics=event_metrics)`)."""

from __future__ import annotations

from collections.abc import Mapping

from whetstone.contracts import DatasetValidatedV1
from whetstone.runtime.messaging import Published
from whetstone.runtime.observability import EventMetric, MetricSet


def event_metrics(m: MetricSet) -> Mapping[str, EventMetric]:
    validated = m.counter("whetstone_datasets_validated_total", "Datasets validated", ["status"])

    def dataset_validated(published: Published) -> None:
        validated.labels(status=m.cap("status", published.read(DatasetValidatedV1).status)).inc()

    return {DatasetValidatedV1.EVENT_TYPE: dataset_validated}
