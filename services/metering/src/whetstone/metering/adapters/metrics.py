"""Prometheus usage metrics per tenant and GPU type, read from the ledger's roll-ups.

They are gauges refreshed from Postgres rather than counters bumped in memory: the
values are then exactly the ledger's (net of corrections), survive restarts, and
every replica reports the same numbers (aggregate with max, not sum)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry, Gauge
from whetstone.contracts import UsageMeteredV1
from whetstone.contracts.enums import ChargeClass, UsageScope
from whetstone.runtime.messaging import Published
from whetstone.runtime.observability import EventMetric, MetricSet

LABELS = ["tenant", "gpu_type", "charge_class"]


class UsageMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        ns = "whetstone_metering"
        self.gpu_seconds = Gauge(f"{ns}_gpu_seconds", "GPU-seconds metered, net of corrections", LABELS,
                                 registry=registry)
        self.billable = Gauge(f"{ns}_billable_gpu_seconds", "GPU-seconds billed, net of corrections", LABELS,
                              registry=registry)
        self.cost = Gauge(f"{ns}_cost_usd", "USD charged, net of corrections", LABELS, registry=registry)
        self.list_cost = Gauge(f"{ns}_list_cost_usd", "USD at list price (for refunded/review: the amount refunded"
                               " or held)", LABELS, registry=registry)
        self.segments = Gauge(f"{ns}_segments", "Segments billed", LABELS, registry=registry)
        self.jobs = Gauge(f"{ns}_jobs", "Finished jobs metered", ["tenant", "outcome"], registry=registry)
        self.month_cost = Gauge(f"{ns}_month_to_date_cost_usd", "USD charged this calendar month (UTC)", ["tenant"],
                                registry=registry)
        self.month_gpu_hours = Gauge(f"{ns}_month_to_date_gpu_hours", "GPU-hours metered this calendar month (UTC)",
                                     ["tenant", "gpu_type"], registry=registry)
        self.anomalies = Gauge(f"{ns}_anomalies_open", "Unbilled input waiting for an operator", ["code"],
                               registry=registry)
        self.waiting = Gauge(f"{ns}_segments_waiting", "Segments waiting for their other end", registry=registry)
        self.event_time = Gauge(f"{ns}_event_time_seconds", "How far the consumed lifecycle streams have got"
                                " (grace periods are measured against it)", registry=registry)
        self.partitions_behind = Gauge(f"{ns}_partitions_behind", "Partitions with messages left to consume",
                                       registry=registry)
        self.refreshed = Gauge(f"{ns}_metrics_refreshed_timestamp_seconds", "When these gauges were read",
                               registry=registry)

    async def refresh(self, pool: asyncpg.Pool, now: datetime) -> None:
        month = now.strftime("%Y-%m")
        async with pool.acquire() as conn:
            usage = await conn.fetch(
                "SELECT tenant_id, gpu_type, charge_class, sum(segments) AS segments, sum(gpu_seconds) AS gpu_seconds,"
                " sum(billable_gpu_seconds) AS billable, sum(cost) AS cost, sum(list_cost) AS list_cost"
                " FROM usage_monthly GROUP BY 1, 2, 3")
            month_rows = await conn.fetch(
                "SELECT tenant_id, gpu_type, sum(gpu_seconds) AS gpu_seconds, sum(cost) AS cost FROM usage_monthly"
                " WHERE period = $1 GROUP BY 1, 2", month)
            jobs = await conn.fetch("SELECT tenant_id, outcome, sum(jobs) AS jobs FROM jobs_monthly GROUP BY 1, 2")
            anomalies = await conn.fetch("SELECT code, count(*) AS n FROM anomalies WHERE resolved_at IS NULL"
                                         " GROUP BY 1")
            waiting = await conn.fetchval("SELECT count(*) FROM segments WHERE waiting")
        # no await below: a scrape never sees a half-refreshed set
        for g in (self.gpu_seconds, self.billable, self.cost, self.list_cost, self.segments, self.jobs,
                  self.month_cost, self.month_gpu_hours, self.anomalies):
            g.clear()
        for tenant, gpu_type, charge_class, segments, gpu_seconds, billable, cost, list_cost in usage:
            labels = (tenant, gpu_type, charge_class)
            self.gpu_seconds.labels(*labels).set(float(gpu_seconds))
            self.billable.labels(*labels).set(float(billable))
            self.cost.labels(*labels).set(float(cost))
            self.list_cost.labels(*labels).set(float(list_cost))
            self.segments.labels(*labels).set(segments)
        spend: dict[str, float] = {}
        for tenant, gpu_type, gpu_seconds, cost in month_rows:
            self.month_gpu_hours.labels(tenant, gpu_type).set(float(gpu_seconds) / 3600)
            spend[tenant] = spend.get(tenant, 0.0) + float(cost)
        for tenant, usd in spend.items():
            self.month_cost.labels(tenant).set(usd)
        for tenant, outcome, n in jobs:
            self.jobs.labels(tenant, outcome).set(n)
        for code, n in anomalies:
            self.anomalies.labels(code).set(n)
        self.waiting.set(waiting)
        self.refreshed.set(now.timestamp())


def event_metrics(m: MetricSet) -> Mapping[str, EventMetric]:
    """Counters of the usage.metered events metering publishes, per tier, GPU type and charge class."""
    seconds = m.counter("whetstone_usage_gpu_seconds_total",
                        "GPU-seconds metered (billable when charged, full when refunded/review)",
                        ["tier", "gpu_type", "charge_class"])
    cost = m.counter("whetstone_usage_cost_total", "Cost metered, in its currency", ["tier", "charge_class", "currency"])

    # the labelled children per label set, looked up once: prometheus_client's labels() takes a lock and
    # checks its arguments on every call, and a settle publishes hundreds of events over a few label sets
    children: dict[tuple[str, str, str, str], tuple[str, Any, Any]] = {}

    def usage_metered(published: Published) -> None:
        # The payload as usage_payload wrote it: a settle publishes hundreds of these, and parsing
        # each into UsageMeteredV1 again would cost about as much as building it did.
        p = published.envelope.payload
        if p["scope"] != UsageScope.SEGMENT:  # the job total repeats its segments
            return
        key = (m.tier_of(published.envelope.tenant_id), str(p["charge_class"]), str(p["gpu_type"]), str(p["currency"]))
        found = children.get(key)
        if found is None:
            tier, charge = key[0], m.cap("charge_class", key[1])
            found = children[key] = (
                charge, seconds.labels(tier=tier, gpu_type=m.cap("gpu_type", key[2]), charge_class=charge),
                cost.labels(tier=tier, charge_class=charge, currency=m.cap("currency", key[3])))
        charge, seconds_child, cost_child = found
        figure = p["billable_gpu_seconds"] if charge == ChargeClass.CHARGED else p["gpu_seconds"]
        seconds_child.inc(max(float(figure or 0), 0.0))
        cost_child.inc(max(float(p["cost"] or 0), 0.0))

    return {UsageMeteredV1.EVENT_TYPE: usage_metered}
