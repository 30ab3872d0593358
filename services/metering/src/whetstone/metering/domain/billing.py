"""Segment billing. Pure: a closed segment in, a ledger entry out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# USD per GPU-hour, by price version -> gpu type -> (on_demand, spot).
PRICE_TABLES: dict[str, dict[str, tuple[float, float]]] = {
    "2026-11": {"cpu": (0.05, 0.02), "A100": (3.00, 1.20), "H100": (5.00, 2.00), "L4": (0.80, 0.35)},
}
CURRENT_PRICE_VERSION = "2026-11"
MAX_SEGMENT_SECONDS = 30 * 24 * 3600


@dataclass(frozen=True)
class ClosedSegment:
    job_id: str
    segment_id: str
    gpu_type: str
    gpu_count: int
    spot: bool
    started_at: datetime
    stopped_at: datetime
    stop_kind: str                  # completed | failed | preempted
    error_class: str | None = None  # for failed: user | platform | ambiguous
    checkpointed_at: datetime | None = None


@dataclass(frozen=True)
class Charge:
    gpu_seconds: float
    billable_gpu_seconds: float
    charge_class: str   # charged | refunded | review
    cost: float
    price_version: str


class Anomaly(ValueError):
    """A segment that must not be billed silently."""


def bill_segment(seg: ClosedSegment, price_version: str = CURRENT_PRICE_VERSION) -> Charge:
    table = PRICE_TABLES.get(price_version)
    if table is None:
        raise Anomaly(f"unknown price version {price_version!r}")
    if seg.gpu_type not in table:
        raise Anomaly(f"unknown GPU type {seg.gpu_type!r} in price version {price_version}")
    seconds = (seg.stopped_at - seg.started_at).total_seconds()
    if seconds < 0:
        raise Anomaly(f"segment stops {-seconds:.0f}s before it starts")
    if seconds > MAX_SEGMENT_SECONDS:
        raise Anomaly(f"segment lasts {seconds:.0f}s, more than {MAX_SEGMENT_SECONDS}s")
    gpu_seconds = seconds * max(seg.gpu_count, 1)
    on_demand, spot = table[seg.gpu_type]
    rate = spot if seg.spot else on_demand
    klass, billable = "charged", gpu_seconds
    if seg.stop_kind == "failed":
        klass = {"user": "charged", "platform": "refunded"}.get(seg.error_class or "", "review")
        billable = gpu_seconds if klass == "charged" else 0.0
    elif seg.stop_kind == "preempted":
        # only work that reached a durable checkpoint is billed, at the spot price
        rate = spot
        done = (seg.checkpointed_at - seg.started_at).total_seconds() if seg.checkpointed_at else 0.0
        billable = max(0.0, min(seconds, done)) * max(seg.gpu_count, 1)
    cost = round(billable / 3600 * rate, 6)
    return Charge(gpu_seconds, billable, klass, cost, price_version)
