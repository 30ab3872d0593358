"""Metrics eval derives from the verdicts it publishes (served on /metrics through the runtime's
Observer: `Service(event_metrics=event_metrics)`)."""

from __future__ import annotations

from collections.abc import Mapping

from whetstone.contracts import EvalCompletedV1
from whetstone.runtime.messaging import Published
from whetstone.runtime.observability import EventMetric, MetricSet


def event_metrics(m: MetricSet) -> Mapping[str, EventMetric]:
    verdicts = m.counter("whetstone_eval_verdicts_total", "Eval gate verdicts", ["verdict"])
    stages = m.counter("whetstone_eval_stage_results_total", "Eval gate stage results", ["stage", "status"])

    def completed(published: Published) -> None:
        ev = published.read(EvalCompletedV1)
        verdicts.labels(verdict=m.cap("verdict", ev.verdict)).inc()
        for stage in ev.stages:
            stages.labels(stage=m.cap("stage", stage.name), status=m.cap("status", stage.status)).inc()

    return {EvalCompletedV1.EVENT_TYPE: completed}
