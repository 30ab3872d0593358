"""Scheduler metrics, in a registry of their own that the service's registry collects (served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class SchedulerMetrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        ns = "whetstone_scheduler"
        self.cycle_seconds = Histogram(f"{ns}_cycle_seconds", "One scheduling cycle (snapshot, decide, apply)",
                                       registry=registry, buckets=(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        self.decisions = Counter(f"{ns}_decisions_total", "Queued jobs examined by scheduling cycles",
                                 registry=registry)
        self.assigned = Counter(f"{ns}_assigned_total", "Jobs placed, by how", ["how"], registry=registry)
        self.preemptions = Counter(f"{ns}_preemption_requests_total", "Jobs told to checkpoint and stop",
                                   ["reason"], registry=registry)
        self.rejected = Counter(f"{ns}_admission_rejected_total", "Submissions refused, by reason code", ["code"],
                                registry=registry)
        self.timeouts = Counter(f"{ns}_state_timeouts_total", "Jobs past a platform-side state timeout, by state",
                                ["state"], registry=registry)
        self.queue_depth = Gauge(f"{ns}_queue_depth", "Queued jobs seen by the last cycle, by tier", ["tier"],
                                 registry=registry)
        self.oldest_wait = Gauge(f"{ns}_oldest_wait_seconds", "Longest current queue wait, by tier", ["tier"],
                                 registry=registry)
