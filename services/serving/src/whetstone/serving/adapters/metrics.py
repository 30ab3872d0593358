"""Serving's Prometheus series, added to the service's registry when it starts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ServingMetrics:
    def __init__(self) -> None:
        self.requests = Counter("whetstone_serving_requests_total", "Completions served, per model name and version",
                                ["tenant", "model", "version", "outcome"], registry=None)
        self.tokens = Counter("whetstone_serving_completion_tokens_total", "Completion tokens generated",
                              ["tenant", "model", "version"], registry=None)
        self.cold_load = Histogram("whetstone_serving_cold_load_seconds", "Adapter load: S3 -> ready", registry=None,
                                   buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.resident = Gauge("whetstone_serving_resident_adapters", "Adapters in memory", registry=None)
        self.rejected = Counter("whetstone_serving_rejected_total", "Requests refused, by error code", ["code"],
                                registry=None)

    def register(self, registry: CollectorRegistry) -> None:
        for metric in (self.requests, self.tokens, self.cold_load, self.resident, self.rejected):
            registry.register(metric)
