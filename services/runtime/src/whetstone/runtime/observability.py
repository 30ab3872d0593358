"""Topic and platform metrics every service exports on /metrics (DESIGN.md: Prometheus on every service).

Three sources, all with low-cardinality labels (never a job, dataset or event id):

* hot-path hooks (`Observer`): messages produced per topic and the relay's publish latency
  (send -> broker ack), and the platform metrics a service derives from the events it COMMITTED to
  its outbox, declared by that service (`Service(event_metrics=...)`, in its `adapters/metrics.py`:
  eval verdicts in eval, failures and preemptions in the scheduler and the trainer-agent, GPU-seconds
  in metering, ...); each event instance has one producer, so platform-wide sums count it once;
* a background `Collector` per service, every `interval_s`: consumer lag per partition of the
  service's group (committed offsets through the Kafka admin API - OffsetFetch with explicit
  partitions, which Tansu answers too - falling back to the consumer's OffsetFetch; vs the
  partitions' end offsets), DLQ depth of the topics it consumes (end offset minus what the
  operators' review group `whetstone-dlq-review` has acknowledged), the topics' high watermarks
  (a produce rate whatever the producer), outbox backlog rows and the age of the oldest, plus the
  SQL probes declared for the service below (the scheduler's jobs per state and node heartbeats);
* `safe_exposition`: /metrics renders whatever collectors work and counts the ones that raise.

Nothing here can crash a service or fail a scrape: every failure is logged (once per kind until it
recovers) and counted in `whetstone_observability_errors_total{service, source}`.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from pydantic_settings import BaseSettings, SettingsConfigDict

from whetstone.contracts import TOPICS

from .logging import get_logger
from .messaging import Published
from .settings import KafkaClientOptions

log = get_logger("whetstone.observability")

DLQ_REVIEW_GROUP = "whetstone-dlq-review"
OTHER = "other"  # label value once a label has seen MAX_LABEL_VALUES distinct values
MAX_LABEL_VALUES = 32
LATENCY_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10)


class ObservabilitySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_METRICS_", extra="ignore")
    interval_s: float = 15.0  # how often the collector reads offsets, outbox and probes
    enabled: bool = True  # false: no collector task (hot-path counters stay)


@dataclass(frozen=True)
class Probe:
    """A gauge read from the service's OWN schema. The query returns rows of
    (label values..., value); a probe that fails is counted and its gauge left as it was."""

    metric: str
    help: str
    labels: tuple[str, ...]
    sql: str


_ERRORS: "weakref.WeakKeyDictionary[CollectorRegistry, Any]" = weakref.WeakKeyDictionary()
_LOGGED: "weakref.WeakKeyDictionary[CollectorRegistry, set[str]]" = weakref.WeakKeyDictionary()


def _errors(registry: CollectorRegistry) -> Any:
    counter = _ERRORS.get(registry)
    if counter is None:
        try:
            counter = Counter("whetstone_observability_errors_total",
                              "Metrics that could not be collected or rendered, by source", ["service", "source"],
                              registry=registry)
        except ValueError:  # the name is taken by something else: count unexported rather than fail
            counter = Counter("whetstone_observability_errors_total", "", ["service", "source"], registry=None)
        _ERRORS[registry] = counter
    return counter


def report_error(registry: CollectorRegistry, service: str, source: str, exc: BaseException | str) -> None:
    """Count (and log once per source until it recovers) a metrics failure of one service."""
    _errors(registry).labels(service=service, source=source).inc()
    logged = _LOGGED.setdefault(registry, set())
    if source not in logged:
        logged.add(source)
        log.warning("metrics unavailable", source=source, service=service, error=str(exc)[:500])


class _Metrics:
    """Registers into the service's registry; a name another part of the service already took
    (a collision) is logged and counted, and the metric lives on unexported."""

    def __init__(self, registry: CollectorRegistry, service: str) -> None:
        self.registry, self.service = registry, service
        _errors(registry)  # exported (empty) from the start, so dashboards and alerts can rely on the name

    def _add(self, kind: type, name: str, doc: str, labels: Sequence[str], **kw: Any) -> Any:
        try:
            return kind(name, doc, labels, registry=self.registry, **kw)
        except ValueError as exc:  # "Duplicated timeseries in CollectorRegistry"
            log.error("metric name collision; the metric is not exported", metric=name, service=self.service,
                      error=str(exc))
            self.error("collision", exc)
            return kind(name, doc, labels, registry=None, **kw)

    def error(self, source: str, exc: BaseException | str) -> None:
        report_error(self.registry, self.service, source, exc)

    def recovered(self, source: str) -> None:
        _LOGGED.get(self.registry, set()).discard(source)


class _Capped:
    """Label values from event payloads, capped so a misbehaving producer cannot explode a series."""

    def __init__(self) -> None:
        self.seen: dict[str, set[str]] = {}

    def __call__(self, label: str, value: object) -> str:
        v = str(value) if value not in (None, "") else "unknown"
        seen = self.seen.setdefault(label, set())
        if v in seen:
            return v
        if len(seen) >= MAX_LABEL_VALUES:
            return OTHER
        seen.add(v)
        return v


class MetricSet(_Metrics):
    """Where a service registers the metrics it derives from the events it commits (its
    `adapters/metrics.py`, handed to the runtime as `Service(event_metrics=...)`): the service's
    registry with collisions counted, capped label values (`cap`) and the tenants' tiers."""

    def __init__(self, registry: CollectorRegistry, service: str, tiers: Mapping[str, str] | None = None) -> None:
        super().__init__(registry, service)
        self.cap = _Capped()
        self.tiers = dict(tiers or {})

    def tier_of(self, tenant_id: str) -> str:
        return self.cap("tier", self.tiers.get(tenant_id, "unknown"))

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        metric: Counter = self._add(Counter, name, doc, labels)
        return metric

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        metric: Gauge = self._add(Gauge, name, doc, labels)
        return metric

    def histogram(self, name: str, doc: str, labels: Sequence[str] = (), *,
                  buckets: Sequence[float] = LATENCY_BUCKETS) -> Histogram:
        metric: Histogram = self._add(Histogram, name, doc, labels, buckets=buckets)
        return metric


# One event type's metric update, given what a unit of work published.
EventMetric = Callable[[Published], None]
# A service's event metrics: registers them in the MetricSet, returns the update per event type.
EventMetrics = Callable[[MetricSet], Mapping[str, EventMetric]]


class Observer(_Metrics):
    """The hot-path hooks of one service (see module docstring)."""

    def __init__(self, registry: CollectorRegistry, service: str, tiers: Mapping[str, str] | None = None,
                 event_metrics: EventMetrics | None = None) -> None:
        super().__init__(registry, service)
        svc = ["service"]
        self.produced = self._add(Counter, "whetstone_messages_produced_total", "Messages the outbox relay published",
                                  svc + ["topic"])
        self.publish_seconds = self._add(Histogram, "whetstone_outbox_publish_seconds",
                                         "Outbox relay: send to broker acknowledgement, per message", svc,
                                         buckets=LATENCY_BUCKETS).labels(service=service)
        self._derive: dict[str, EventMetric] = (
            dict(event_metrics(MetricSet(registry, service, tiers))) if event_metrics else {})

    # -- hooks --------------------------------------------------------------
    def published(self, topic: str, seconds: float) -> None:
        """The relay got the broker's acknowledgement for one message."""
        self.produced.labels(service=self.service, topic=topic).inc()
        self.publish_seconds.observe(seconds)

    def committed(self, published: Iterable[Published]) -> None:
        """A unit of work committed these events to the outbox: the service's event metrics count them."""
        for item in published:
            derive = self._derive.get(item.envelope.event_type)
            if derive is None:
                continue
            try:
                derive(item)
            except Exception as exc:  # a payload we do not understand is not worth a failed commit
                self.error("event_metrics", exc)


class Collector(_Metrics):
    """Reads the bus, the outbox and the service's probes every `interval_s` (see module docstring)."""

    def __init__(self, registry: CollectorRegistry, service: str, *, group: str, bootstrap: str,
                 topics: Sequence[str], pool: Any = None, probes: Sequence[Probe] = (),
                 interval_s: float = 15.0, timeout_s: float | None = None,
                 client_options: KafkaClientOptions | None = None) -> None:
        super().__init__(registry, service)
        self.group, self.bootstrap, self.pool = group, bootstrap, pool
        self.topics = [t for t in topics if t in TOPICS]
        self.dlqs = [TOPICS[t].dlq for t in self.topics]
        self.probes = list(probes)
        self.interval_s = interval_s
        self.client_options = client_options or {}  # security (SASL/SSL), see CommonSettings
        self.timeout_s = timeout_s or max(5.0, interval_s)
        self._admin: Any = None
        self._offsets: Any = None
        self._admin_refused = False
        svc = ["service"]
        self.lag = self._add(Gauge, "whetstone_consumer_lag",
                             "Messages on a partition not yet committed by the consumer group",
                             svc + ["group", "topic", "partition"])
        self.high_watermark = self._add(Gauge, "whetstone_topic_high_watermark",
                                        "Sum of the topic's partition end offsets (rate = produced/s)", ["topic"])
        self.dlq_depth = self._add(Gauge, "whetstone_dlq_depth",
                                   f"Dead letters not yet acknowledged by group {DLQ_REVIEW_GROUP}", ["topic"])
        self.outbox_rows = self._add(Gauge, "whetstone_outbox_backlog", "Outbox rows not yet published", svc)
        self.outbox_age = self._add(Gauge, "whetstone_outbox_oldest_age_seconds",
                                    "Age of the oldest unpublished outbox row (0 when none)", svc)
        self.outbox_quarantined = self._add(Gauge, "whetstone_outbox_quarantined",
                                            "Outbox rows the broker refused for themselves (see the relay's log)", svc)
        self.last_success = self._add(Gauge, "whetstone_observability_last_success_timestamp_seconds",
                                      "When each collector source last succeeded", svc + ["source"])
        self.probe_gauges = {p.metric: self._add(Gauge, p.metric, p.help, list(p.labels)) for p in self.probes}

    async def run(self) -> None:
        try:
            while True:
                await self.collect_once()
                await asyncio.sleep(self.interval_s)
        finally:
            await self.close()

    async def collect_once(self) -> None:
        """One round; never raises (except cancellation)."""
        for source, step in (("kafka", self._collect_kafka), ("outbox", self._collect_outbox),
                             ("probes", self._collect_probes)):
            try:
                await asyncio.wait_for(step(), timeout=self.timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.error(source, exc if str(exc) else type(exc).__name__)
                if source == "kafka":
                    await self.close()  # reconnect next round
            else:
                self.recovered(source)
                self.last_success.labels(service=self.service, source=source).set(time.time())

    async def close(self) -> None:
        for client in (self._admin, self._offsets):
            if client is None:
                continue
            try:  # bounded: a dead broker must not hold up the service's shutdown
                await asyncio.wait_for(client.close() if hasattr(client, "close") else client.stop(), timeout=5)
            except Exception:
                pass
        self._admin = self._offsets = None
        self._admin_refused = False  # a new connection may reach a broker that answers it

    # -- Kafka ----------------------------------------------------------------
    async def _clients(self) -> tuple[Any, Any]:
        from aiokafka import AIOKafkaConsumer  # noqa: PLC0415
        from aiokafka.admin import AIOKafkaAdminClient  # noqa: PLC0415

        if self._offsets is None:
            offsets = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                       client_id=f"whetstone-{self.service}-metrics", request_timeout_ms=5000,
                                       **self.client_options)
            await offsets.start()
            self._offsets = offsets
        if self._admin is None:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000,
                                        client_id=f"whetstone-{self.service}-metrics-admin", **self.client_options)
            await admin.start()
            self._admin = admin
        return self._admin, self._offsets

    async def committed(self, group: str, partitions: list[Any]) -> dict[Any, int | None]:
        """The group's committed offsets: admin API (OffsetFetch, explicit partitions); a broker that
        refuses it is counted (source=admin_api) and asked through a consumer of the group instead."""
        from aiokafka import AIOKafkaConsumer  # noqa: PLC0415

        admin, _ = await self._clients()
        if not self._admin_refused:
            try:
                got = await admin.list_consumer_group_offsets(group, partitions=partitions)
                return {tp: (om.offset if om is not None and om.offset >= 0 else None)
                        for tp, om in ((tp, got.get(tp)) for tp in partitions)}
            except Exception as exc:
                self.error("admin_api", exc if str(exc) else type(exc).__name__)
                self._admin_refused = True  # do not hammer a broker that refuses it; retried after a reconnect
                await self._reset_admin()
        member = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=group, enable_auto_commit=False,
                                  client_id=f"whetstone-{self.service}-metrics-offsets", request_timeout_ms=5000,
                                  **self.client_options)
        await member.start()  # never subscribes: does not join the group nor trigger a rebalance
        try:
            return {tp: await member.committed(tp) for tp in partitions}
        finally:
            await member.stop()

    async def _reset_admin(self) -> None:
        if self._admin is not None:
            try:
                await self._admin.close()
            except Exception:
                pass
        self._admin = None

    async def _collect_kafka(self) -> None:
        from aiokafka import TopicPartition  # noqa: PLC0415

        if not self.topics:
            return
        _, offsets = await self._clients()
        known = await offsets.topics()  # refreshes the metadata: partitions as the broker has them

        def partitions(topic: str) -> list[Any]:
            return [TopicPartition(topic, p) for p in sorted(offsets.partitions_for_topic(topic) or ())]

        subscribed = [tp for t in self.topics if t in known for tp in partitions(t)]
        dlq = [tp for t in self.dlqs if t in known for tp in partitions(t)]
        ends = await offsets.end_offsets(subscribed + dlq)
        starts = await offsets.beginning_offsets(dlq) if dlq else {}
        per_topic: dict[str, int] = {}
        for tp in subscribed:
            per_topic[tp.topic] = per_topic.get(tp.topic, 0) + ends.get(tp, 0)
        for topic, end in per_topic.items():  # first: a refused OffsetFetch leaves these
            self.high_watermark.labels(topic=topic).set(end)
        reviewed = await self.committed(DLQ_REVIEW_GROUP, dlq) if dlq else {}
        for tp in dlq:
            acked = max(starts.get(tp, 0), reviewed.get(tp) or 0)
            self.dlq_depth.labels(topic=tp.topic).set(max(ends.get(tp, 0) - acked, 0))
        committed = await self.committed(self.group, subscribed) if subscribed else {}
        for tp in subscribed:
            done = committed.get(tp)
            self.lag.labels(service=self.service, group=self.group, topic=tp.topic,
                            partition=str(tp.partition)).set(max(ends.get(tp, 0) - (done or 0), 0))

    # -- Postgres ---------------------------------------------------------------
    async def _collect_outbox(self) -> None:
        if self.pool is None:
            return
        unsent, quarantined, age = await self.pool.fetchrow(
            "SELECT count(*) FILTER (WHERE quarantined_at IS NULL), count(*) FILTER (WHERE quarantined_at IS NOT"
            " NULL), coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE quarantined_at"
            " IS NULL)), 0)::float8 FROM outbox WHERE sent_at IS NULL")
        self.outbox_rows.labels(service=self.service).set(unsent)
        self.outbox_age.labels(service=self.service).set(age)
        self.outbox_quarantined.labels(service=self.service).set(quarantined)

    async def _collect_probes(self) -> None:
        if self.pool is None or not self.probes:
            return
        failed: list[str] = []
        for probe in self.probes:
            gauge = self.probe_gauges[probe.metric]
            try:
                rows = await self.pool.fetch(probe.sql)
            except Exception as exc:
                failed.append(f"{probe.metric}: {exc}")
                continue
            gauge.clear()  # a state with no jobs left reads 0 through absence, not a stale value
            for row in rows:
                values = list(row.values())
                gauge.labels(*[str(v) for v in values[:-1]]).set(float(values[-1] or 0))
        if failed:
            raise RuntimeError("; ".join(failed))


def safe_exposition(registry: CollectorRegistry, service: str) -> bytes:
    """The registry in the text format. A collector that raises is skipped, logged and counted;
    the others still render, so a scrape never 500s."""

    def on_error(source: str, exc: BaseException) -> None:
        report_error(registry, service, source, exc)

    try:
        return generate_latest(registry)
    except Exception as exc:
        on_error("exposition", exc)
    parts: list[bytes] = []
    for collector in list(getattr(registry, "_collector_to_names", {})):
        try:
            single = CollectorRegistry(auto_describe=False)
            single.register(collector)
            parts.append(generate_latest(single))
        except Exception as exc:
            on_error("exposition", exc)
    return b"".join(parts)


class _Disabled:
    async def run(self) -> None:
        return None


def collector_for(rt: Any) -> Collector | _Disabled:
    """The collector of a started `Runtime` (its group, subscriptions, pool and probes)."""
    cfg = ObservabilitySettings()
    if not cfg.enabled:
        return _Disabled()
    return Collector(rt.metrics.registry, rt.name, group=rt.consumer, bootstrap=rt.settings.kafka_bootstrap,
                     topics=list(rt.service.subscriptions), pool=rt.pool,
                     probes=tuple(rt.service.probes), interval_s=cfg.interval_s,
                     client_options=rt.settings.kafka_client_options())
