"""Metrics the registry derives from the registrations and stage changes it publishes (served on
/metrics through the runtime's Observer: `Service(event_metrics=event_metrics)`)."""

from __future__ import annotations

from collections.abc import Mapping

from whetstone.contracts import ModelPromotedV1, ModelRegisteredV1
from whetstone.runtime.messaging import Published
from whetstone.runtime.observability import EventMetric, MetricSet


def event_metrics(m: MetricSet) -> Mapping[str, EventMetric]:
    models = m.counter("whetstone_models_registered_total", "Models registered", ["stage"])
    promotions = m.counter("whetstone_model_promotions_total", "Model stage changes", ["to_stage"])

    def registered(published: Published) -> None:
        models.labels(stage=m.cap("stage", published.read(ModelRegisteredV1).stage)).inc()

    def promoted(published: Published) -> None:
        promotions.labels(to_stage=m.cap("to_stage", published.read(ModelPromotedV1).to_stage)).inc()

    return {ModelRegisteredV1.EVENT_TYPE: registered, ModelPromotedV1.EVENT_TYPE: promoted}
