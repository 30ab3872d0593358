"""Metrics the trainer-agent derives from the training events it publishes (served on /metrics
through the runtime's Observer: `Service(event_metrics=event_metrics)`): steps, tokens, step time,
throughput, MFU and GPU utilisation from `job.progress`; runs finished, failed and preempted."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from whetstone.contracts import (
    JobCompletedV1,
    JobFailedV1,
    JobPreemptedV1,
    JobProgressV1,
)
from whetstone.runtime.messaging import Published
from whetstone.runtime.observability import EventMetric, MetricSet

MAX_SEGMENTS = 10_000  # segments that ended unseen are forgotten past this many


@dataclass(frozen=True)
class LastReport:
    """A segment's previous progress report: steps and tokens count the difference to the next."""

    step: int
    at: float
    tokens_seen: int | None


def event_metrics(m: MetricSet) -> Mapping[str, EventMetric]:
    completed = m.counter("whetstone_training_completed_total", "Training runs finished")
    failed = m.counter("whetstone_jobs_failed_total", "Jobs failed, by class and code", ["error_class", "code"])
    preempted = m.counter("whetstone_jobs_preempted_total", "Training segments preempted, by cause", ["reason"])
    steps = m.counter("whetstone_training_steps_total", "Training steps reported")
    tokens = m.counter("whetstone_training_tokens_total", "Training tokens seen (progress deltas)")
    tokens_per_s = m.histogram("whetstone_training_tokens_per_second", "Training throughput reports",
                               buckets=(10, 100, 1e3, 3e3, 1e4, 3e4, 1e5, 3e5, 1e6))
    step_seconds = m.histogram("whetstone_training_step_seconds",
                               "Wall time per training step, between progress reports",
                               buckets=(.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
    mfu = m.histogram("whetstone_training_mfu_ratio",
                      "Model FLOPs utilisation reported by training progress (GPUs of a known type only)",
                      buckets=(.02, .05, .1, .15, .2, .25, .3, .35, .4, .5, .6, .8))
    gpu_util = m.gauge("whetstone_training_gpu_utilization_ratio",
                       "Last GPU (or CPU) utilisation reported by training progress")
    last: dict[str, LastReport] = {}

    def progress(published: Published) -> None:
        ev, now = published.read(JobProgressV1), time.monotonic()
        before = last.get(ev.segment_id)
        if before is not None and ev.step > before.step:
            steps.inc(ev.step - before.step)
            # measured by the recipe; else the time between the reports' commits
            step_seconds.observe(ev.step_time_s or (now - before.at) / (ev.step - before.step))
            if ev.tokens_seen is not None and before.tokens_seen is not None and ev.tokens_seen > before.tokens_seen:
                tokens.inc(ev.tokens_seen - before.tokens_seen)
        if len(last) > MAX_SEGMENTS:
            last.clear()
        last[ev.segment_id] = LastReport(ev.step, now, ev.tokens_seen)
        if ev.tokens_per_s:
            tokens_per_s.observe(ev.tokens_per_s)
        if ev.gpu_utilization is not None:
            gpu_util.set(ev.gpu_utilization)
        if ev.mfu is not None:
            mfu.observe(ev.mfu)

    def job_failed(published: Published) -> None:
        ev = published.read(JobFailedV1)
        failed.labels(error_class=m.cap("error_class", ev.error_class), code=m.cap("code", ev.code)).inc()
        if ev.segment_id is not None:
            last.pop(ev.segment_id, None)

    def job_preempted(published: Published) -> None:
        ev = published.read(JobPreemptedV1)
        preempted.labels(reason=m.cap("reason", ev.reason)).inc()
        last.pop(ev.segment_id, None)

    def job_completed(published: Published) -> None:
        completed.inc()
        last.pop(published.read(JobCompletedV1).segment_id, None)

    return {JobProgressV1.EVENT_TYPE: progress, JobFailedV1.EVENT_TYPE: job_failed,
            JobPreemptedV1.EVENT_TYPE: job_preempted, JobCompletedV1.EVENT_TYPE: job_completed}
