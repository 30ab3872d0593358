"""The usage counters metering derives from the usage.metered events it publishes: per tier, GPU type and
charge class, the billable seconds of a charge and the full seconds of a refund or review; job totals not
counted again (they repeat their segments). The labelled children are looked up once per label set: the
figures must be what one labels() call per event gave."""

from decimal import Decimal

import pytest
from prometheus_client import CollectorRegistry
from whetstone.contracts import UsageMeteredV1
from whetstone.metering.adapters.metrics import event_metrics
from whetstone.metering.domain.billing import Charge
from whetstone.metering.domain.ledger import Entry
from whetstone.metering.usecases.metering import usage_envelope
from whetstone.runtime.messaging import Published
from whetstone.runtime.observability import MetricSet

pytestmark = pytest.mark.unit


def entry(job: str, tenant: str, klass: str, gpu: str, seconds: str, billable: str, cost: str, scope: str = "segment"
          ) -> Entry:
    c = Charge(klass, Decimal(seconds), Decimal(billable), Decimal(2), Decimal(cost), Decimal(cost), "v1", "std",
               "2026-11", "basis")
    return Entry(job, tenant, scope, "" if scope == "job" else f"{job}-s", "charge", 0, c, gpu, 1, False, ())


def test_usage_counters_per_label_set() -> None:
    registry = CollectorRegistry()
    update = event_metrics(MetricSet(registry, "metering", {"acme": "premium", "demo": "standard"}))[
        UsageMeteredV1.EVENT_TYPE]
    entries = [entry("j1", "acme", "charged", "H100", "100", "90", "1.5"),
               entry("j2", "acme", "charged", "H100", "10", "10", "0.25"),
               entry("j3", "acme", "refunded", "H100", "40", "0", "0"),
               entry("j4", "demo", "charged", "A10", "7", "7", "0.5"),
               entry("j5", "nobody", "review", "A10", "3", "0", "0"),
               entry("j1", "acme", "charged", "H100", "110", "100", "1.75", scope="job")]
    for e in entries:
        update(Published(usage_envelope(e, "metering", None)))
    seconds = lambda tier, gpu, klass: registry.get_sample_value(
        "whetstone_usage_gpu_seconds_total", {"tier": tier, "gpu_type": gpu, "charge_class": klass})
    cost = lambda tier, klass: registry.get_sample_value(
        "whetstone_usage_cost_total", {"tier": tier, "charge_class": klass, "currency": "USD"})
    assert seconds("premium", "H100", "charged") == 100.0  # billable seconds, the job total not again
    assert seconds("premium", "H100", "refunded") == 40.0  # full seconds of a refund
    assert seconds("standard", "A10", "charged") == 7.0
    assert seconds("unknown", "A10", "review") == 3.0
    assert cost("premium", "charged") == 1.75
    assert cost("standard", "charged") == 0.5
