"""Scheduler metrics, in a registry of their own that the service's registry collects (served on /metrics),
and the metrics derived from the job events the scheduler publishes (`event_metrics`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from whetstone.contracts import JobFailedV1, JobPreemptedV1, JobQueuedV1
from whetstone.contracts.platform_events import GpuSample, NodeHeartbeatV1
from whetstone.runtime.messaging import Published
from whetstone.runtime.observability import EventMetric, MetricSet

# Queue waits run from seconds (an idle pool) to days (a free tier behind a busy one).
QUEUE_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400)


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
        self.queue_wait = Histogram(f"{ns}_queue_wait_seconds",
                                    "Time a job waited in the queue before it was placed (each stint of a "
                                    "preempted job counts apart), by tier", ["tier"], registry=registry,
                                    buckets=QUEUE_WAIT_BUCKETS)
        self.nodes = NodeTelemetry()
        registry.register(self.nodes)


@dataclass(frozen=True)
class NodeFigures:
    """The hardware figures of one heartbeat that the gauges show."""
    gpus: tuple[GpuSample, ...] = ()
    cpu_percent: float | None = None
    rss_mb: float | None = None

    @classmethod
    def of(cls, hb: NodeHeartbeatV1) -> NodeFigures:
        return cls(tuple(hb.gpus), hb.cpu_percent, hb.rss_mb)


GpuFigure = Callable[[GpuSample], float | None]
NodeFigure = Callable[[NodeFigures], float | None]


def _gpu_values(figures: NodeFigures, figure: GpuFigure) -> list[float]:
    return [v for v in (figure(g) for g in figures.gpus) if v is not None]


def _gpu_mean(figure: GpuFigure, scale: float = 1.0) -> NodeFigure:
    def value(figures: NodeFigures) -> float | None:
        vals = _gpu_values(figures, figure)
        return sum(vals) / len(vals) * scale if vals else None
    return value


def _gpu_sum(figure: GpuFigure, scale: float = 1.0) -> NodeFigure:
    def value(figures: NodeFigures) -> float | None:
        vals = _gpu_values(figures, figure)
        return sum(vals) * scale if vals else None
    return value


def _gpu_max(figure: GpuFigure) -> NodeFigure:
    def value(figures: NodeFigures) -> float | None:
        vals = _gpu_values(figures, figure)
        return max(vals) if vals else None
    return value


def _scaled(figure: NodeFigure, scale: float) -> NodeFigure:
    def value(figures: NodeFigures) -> float | None:
        v = figure(figures)
        return v * scale if v is not None else None
    return value


# name, help, the heartbeat figure it shows (None: absent from this heartbeat)
_NODE_GAUGES: tuple[tuple[str, str, NodeFigure], ...] = (
    ("whetstone_node_gpu_utilization_ratio", "Mean GPU utilisation of the node's GPUs (nvidia-smi), last heartbeat",
     _gpu_mean(lambda g: g.utilization_pct, 0.01)),
    ("whetstone_node_gpu_memory_used_bytes", "GPU memory in use on the node, summed over its GPUs",
     _gpu_sum(lambda g: g.memory_used_mb, 2**20)),
    ("whetstone_node_gpu_memory_total_bytes", "GPU memory of the node, summed over its GPUs",
     _gpu_sum(lambda g: g.memory_total_mb, 2**20)),
    ("whetstone_node_gpu_power_watts", "Power drawn by the node's GPUs, summed", _gpu_sum(lambda g: g.power_w)),
    ("whetstone_node_gpu_temperature_celsius", "Hottest GPU of the node", _gpu_max(lambda g: g.temperature_c)),
    ("whetstone_node_cpu_utilization_ratio", "Node CPU busy ratio between two heartbeats",
     _scaled(lambda f: f.cpu_percent, 0.01)),
    ("whetstone_node_agent_rss_bytes", "Resident memory of the trainer agent and its training processes",
     _scaled(lambda f: f.rss_mb, 2**20)),
)


class NodeTelemetry(Collector):
    """The hardware figures of each node's last heartbeat, as gauges labelled by node (a handful of
    nodes: low cardinality). A node silent for `ttl_s` drops out, so a lost node shows no stale values."""

    def __init__(self, ttl_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        self.last: dict[str, tuple[float, str, NodeFigures]] = {}  # node -> (seen, gpu_type, heartbeat figures)

    def observe(self, node_id: str, gpu_type: str, figures: NodeFigures) -> None:
        self.last[node_id] = (self.clock(), gpu_type, figures)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self.clock()
        for node, (seen, _, _) in list(self.last.items()):
            if now - seen > self.ttl_s:
                self.last.pop(node, None)
        for name, doc, value_of in _NODE_GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["node", "gpu_type"])
            for node, (_, gpu_type, figures) in sorted(self.last.items()):
                value = value_of(figures)
                if value is not None:
                    family.add_metric([node, gpu_type], float(value))
            yield family


def event_metrics(m: MetricSet) -> Mapping[str, EventMetric]:
    """Jobs admitted to the queue; jobs the scheduler failed or moved off a node (a lost node, a timeout)."""
    queued = m.counter("whetstone_jobs_queued_total", "Jobs admitted to the queue", ["tier", "requeued"])
    failed = m.counter("whetstone_jobs_failed_total", "Jobs failed, by class and code", ["error_class", "code"])
    preempted = m.counter("whetstone_jobs_preempted_total", "Training segments preempted, by cause", ["reason"])

    def job_queued(published: Published) -> None:
        ev = published.read(JobQueuedV1)
        queued.labels(tier=m.cap("tier", ev.tier), requeued=str(ev.requeued).lower()).inc()

    def job_failed(published: Published) -> None:
        ev = published.read(JobFailedV1)
        failed.labels(error_class=m.cap("error_class", ev.error_class), code=m.cap("code", ev.code)).inc()

    def job_preempted(published: Published) -> None:
        preempted.labels(reason=m.cap("reason", published.read(JobPreemptedV1).reason)).inc()

    return {JobQueuedV1.EVENT_TYPE: job_queued, JobFailedV1.EVENT_TYPE: job_failed,
            JobPreemptedV1.EVENT_TYPE: job_preempted}
