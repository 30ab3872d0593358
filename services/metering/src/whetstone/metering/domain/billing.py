"""Segment billing. Pure: the two ends of a segment and its pricing context in,
a charge or an anomaly out.

A segment is one run of a job on a node, from its start to its stop; queue time is
never part of it. Rules (see also the refund policy in ledger.py, which is per job):

- completed: charged in full, at the spot price on a spot node, on-demand otherwise;
- failed by the user: charged in full; by the platform: refunded; ambiguous: held for review;
- preempted: charged at the spot price, only for the work up to the last checkpoint of
  this segment (the lost work after it is not billed, nor is a segment without one);
- preempted because the platform lost the node (or timed the segment out on its side): the
  platform's fault, so the whole segment is refunded, with the checkpointed and the lost
  GPU-seconds named in its basis;
- preempted because the tenant paused the job (reason `pause`): the tenant's own stop, after an
  emergency checkpoint of all its work, so charged in full at the capacity's price, like a
  completed segment. The job stays open (a pause is no outcome).

Input that cannot be billed honestly is an `Anomaly`, never a silent charge.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from whetstone.contracts.enums import ChargeClass, ErrorClass, PreemptionReason

from .kinds import ReviewDecision, StopKind
from .prices import PRICE_BOOK, TIERS, PriceBook

MAX_SEGMENT_SECONDS = 30 * 24 * 3600
MAX_GPUS_PER_SEGMENT = 1024
MICRO_USD = Decimal("0.000001")

# Preemption reasons that are the platform's fault, not capacity the tenant accepted (spot, priority).
PLATFORM_LOSSES = frozenset({PreemptionReason.NODE_LOST, PreemptionReason.PLATFORM_TIMEOUT})
# When two classes meet (a segment's own and its job's), the one kinder to the tenant wins.
_KINDNESS = {ChargeClass.CHARGED: 0, ChargeClass.REVIEW: 1, ChargeClass.REFUNDED: 2}


@dataclass(frozen=True)
class Start:
    event_id: str
    started_at: datetime
    gpu_type: str
    gpu_count: int
    spot: bool
    attempt: int
    node_id: str


@dataclass(frozen=True)
class Stop:
    event_id: str
    kind: StopKind
    stopped_at: datetime
    error_class: ErrorClass | None = None  # failed: whose fault
    code: str | None = None             # failed: the error code
    checkpointed_at: datetime | None = None  # preempted: when the last durable checkpoint was written
    reason: PreemptionReason | None = None  # preempted: why
    reported_at: datetime | None = None  # when the stop event was emitted (grace periods count from it)

    @property
    def reported(self) -> datetime:
        return self.reported_at or self.stopped_at


_STOP_ORDER = {StopKind.COMPLETED: 0, StopKind.FAILED: 1, StopKind.PREEMPTED: 2}


def pick_start(current: Start | None, new: Start) -> Start:
    """Two different start events for one segment: the later start wins (the shorter segment).
    A max over a total order, so the result does not depend on arrival order."""
    if current is None:
        return new
    return max(current, new, key=lambda s: (s.started_at, s.event_id))


def pick_stop(current: Stop | None, new: Stop) -> Stop:
    """Several stop events for one segment (the agent says completed, the scheduler says the
    node was lost): the earliest stop wins, then completed over failed over preempted."""
    if current is None:
        return new
    return min(current, new, key=lambda s: (s.stopped_at, _STOP_ORDER.get(s.kind, 9), s.event_id))


@dataclass(frozen=True)
class Pricing:
    """What the job contributes to a segment's price."""

    tier: str | None                  # the job's tier (free | standard | premium); None: unknown tenant
    pinned_version: str | None = None  # a quote's price version, if the job was admitted with one
    job_class: ChargeClass | None = None  # refunded | review when the job's outcome refunds or holds all of it
    review_decision: ReviewDecision | None = None  # once a reviewer decided


@dataclass(frozen=True)
class Charge:
    charge_class: ChargeClass
    gpu_seconds: Decimal          # wall seconds x GPUs, all of it (exact to the microsecond)
    billable_gpu_seconds: Decimal  # what the tenant pays for
    rate: Decimal                 # USD per GPU-hour applied
    cost: Decimal                 # USD the tenant pays
    list_cost: Decimal            # USD it would pay if charged: the refunded or held amount
    price_version: str
    tier: str
    period: str                   # YYYY-MM the usage belongs to (month of the stop, UTC)
    basis: str                    # why, in words


@dataclass(frozen=True)
class Anomaly:
    code: str
    message: str


def seconds_between(start: datetime, stop: datetime) -> Decimal:
    """Exact, so that sums do not depend on the order they are added in."""
    return Decimal((stop - start) // timedelta(microseconds=1)).scaleb(-6)


def billing_month(at: datetime) -> str:
    """The month a charge belongs to, as strftime("%Y-%m") writes it, at a fraction of its cost (once per charge)."""
    return f"{at.year}-{at.month:02d}"


def usd(billable_gpu_seconds: Decimal, rate: Decimal) -> Decimal:
    return (billable_gpu_seconds * rate / 3600).quantize(MICRO_USD, rounding=ROUND_HALF_UP)


def kinder(a: ChargeClass, b: ChargeClass | None) -> ChargeClass:
    return a if b is None or _KINDNESS[a] >= _KINDNESS[b] else b


def own_class(stop: Stop) -> ChargeClass:
    if stop.kind == StopKind.FAILED:
        if stop.error_class == ErrorClass.USER:
            return ChargeClass.CHARGED
        return ChargeClass.REFUNDED if stop.error_class == ErrorClass.PLATFORM else ChargeClass.REVIEW
    if stop.kind == StopKind.PREEMPTED and stop.reason in PLATFORM_LOSSES:
        return ChargeClass.REFUNDED
    return ChargeClass.CHARGED


def bill_segment(start: Start, stop: Stop, pricing: Pricing, book: PriceBook = PRICE_BOOK) -> Charge | Anomaly:
    if pricing.tier is None:
        return Anomaly("unknown_tenant", "the tenant has no tier in this deployment")
    if pricing.tier not in TIERS:
        return Anomaly("unknown_tier", f"tier {pricing.tier!r} has no prices")
    if pricing.pinned_version is not None:
        version = book.get(pricing.pinned_version)
        if version is None:
            return Anomaly("unknown_price_version", f"the job was quoted price version {pricing.pinned_version!r},"
                                                    " which this price book does not have")
    else:
        version = book.in_effect(start.started_at)
        if version is None:
            return Anomaly("no_price_version", f"no price version in effect at {start.started_at.isoformat()}")
    rate = version.rate(start.gpu_type, pricing.tier)
    if rate is None:
        return Anomaly("unknown_gpu_type", f"GPU type {start.gpu_type!r} has no {pricing.tier} price"
                                           f" in version {version.version}")
    if not 1 <= start.gpu_count <= MAX_GPUS_PER_SEGMENT:
        return Anomaly("absurd_gpu_count", f"{start.gpu_count} GPUs in one segment")
    seconds = seconds_between(start.started_at, stop.stopped_at)
    if seconds < 0:
        return Anomaly("stop_before_start", f"the segment stops {-seconds:.0f}s before it starts")
    if seconds > MAX_SEGMENT_SECONDS:
        return Anomaly("absurd_duration", f"the segment lasts {seconds:.0f}s, more than {MAX_SEGMENT_SECONDS}s")
    return _price(start, stop, pricing, version.version, rate.spot if start.spot else rate.on_demand, rate.spot,
                  seconds)


def _price(start: Start, stop: Stop, pricing: Pricing, version: str, capacity_rate: Decimal, spot_rate: Decimal,
           seconds: Decimal) -> Charge:
    assert pricing.tier is not None
    gpu_seconds = seconds * start.gpu_count
    capacity = "spot" if start.spot else "on-demand"
    paused = stop.kind == StopKind.PREEMPTED and stop.reason == PreemptionReason.PAUSE
    if stop.kind == StopKind.PREEMPTED and not paused:
        done = seconds_between(start.started_at, stop.checkpointed_at) if stop.checkpointed_at else Decimal(0)
        saved = min(max(done, Decimal(0)), seconds) * start.gpu_count
        if stop.reason in PLATFORM_LOSSES:  # refunded in full, at the capacity's own price
            rate, chargeable = capacity_rate, gpu_seconds
            basis = (f"preempted ({stop.reason}): {saved:.0f} of {gpu_seconds:.0f} GPU-s checkpointed,"
                     f" {gpu_seconds - saved:.0f} GPU-s lost; the platform's fault, refunded at {capacity}")
        else:
            rate, chargeable = spot_rate, saved
            basis = f"preempted ({stop.reason or 'unknown'}): {saved:.0f} of {gpu_seconds:.0f} GPU-s checkpointed, at spot"
    else:
        rate, chargeable = capacity_rate, gpu_seconds
        what = "paused by the tenant" if paused else f"{stop.kind}"
        basis = what + (f" ({stop.error_class}: {stop.code})" if stop.kind == StopKind.FAILED else "") \
            + f": {gpu_seconds:.0f} GPU-s at {capacity}"
    klass = kinder(own_class(stop), pricing.job_class)
    if klass == ChargeClass.REVIEW and pricing.review_decision:
        klass = ChargeClass.CHARGED if pricing.review_decision == ReviewDecision.CHARGE else ChargeClass.REFUNDED
        basis += f"; reviewed: {pricing.review_decision}"
    elif pricing.job_class and klass == pricing.job_class and klass != own_class(stop):
        basis += f"; the job {'was refunded' if klass == ChargeClass.REFUNDED else 'is under review'}"
    list_cost = usd(chargeable, rate)
    billable, cost = (chargeable, list_cost) if klass == ChargeClass.CHARGED else (Decimal(0), Decimal(0))
    basis += f", {pricing.tier} tier, {rate}/GPU-h ({version})"
    return Charge(klass, gpu_seconds, billable, rate, cost, list_cost, version, pricing.tier,
                  billing_month(stop.stopped_at), basis)
