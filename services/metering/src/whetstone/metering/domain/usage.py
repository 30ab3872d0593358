"""What the usage API reads: ledger lines, anomalies, waiting segments and monthly roll-ups as
records, and the sums made of them (a job's net, a tenant's month). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from whetstone.contracts.enums import ChargeClass, UsageScope

from .kinds import EntryKind, Outcome


@dataclass(frozen=True)
class LedgerLine:
    """One row of the append-only ledger, as written (see domain/ledger.py `Entry`)."""

    id: int
    job_id: str
    tenant_id: str
    scope: UsageScope
    segment_id: str            # '' for the job total
    entry: EntryKind
    revision: int
    gpu_type: str | None
    gpu_count: int
    spot: bool | None
    tier: str
    gpu_seconds: Decimal
    billable_gpu_seconds: Decimal
    rate: Decimal
    cost: Decimal
    list_cost: Decimal
    charge_class: ChargeClass
    price_version: str
    period: str
    segments: int
    outcome: Outcome | None
    basis: str
    source_events: tuple[str, ...]
    usage_event_id: str
    created_at: datetime


@dataclass(frozen=True)
class WaitingSegment:
    """A segment neither billed nor anomalous yet: which of its ends metering has seen."""

    segment_id: str
    started: bool
    stopped: bool


@dataclass(frozen=True)
class AnomalyRecord:
    job_id: str
    tenant_id: str
    segment_id: str
    code: str
    reason: str
    event_ids: tuple[str, ...]
    created_at: datetime
    resolved_at: datetime | None
    resolution: str | None


@dataclass(frozen=True)
class HeldJob:
    """A job with segments held for review, and the list price they hold."""

    job_id: str
    tenant_id: str
    segments: int
    held: Decimal


@dataclass(frozen=True)
class AuditEvent:
    """An event metering used, with the message as it was received (JSON text): the audit trail
    behind each ledger line."""

    event_id: str
    event_type: str
    job_id: str
    segment_id: str | None
    tenant_id: str
    occurred_at: datetime      # when it was emitted
    received_at: datetime
    envelope: str


@dataclass(frozen=True)
class MonthlyUsage:
    """A tenant's month for one GPU type and charge class (the usage_monthly roll-up)."""

    gpu_type: str
    charge_class: ChargeClass
    segments: int
    gpu_seconds: Decimal
    billable_gpu_seconds: Decimal
    cost: Decimal
    list_cost: Decimal


def job_class_of(classes: AbstractSet[str], fallback: str) -> ChargeClass:
    """A job's class from its segments' current classes (its total line's own when it has none)."""
    if ChargeClass.REVIEW in classes:
        return ChargeClass.REVIEW
    if classes == {ChargeClass.REFUNDED}:
        return ChargeClass.REFUNDED
    return ChargeClass.CHARGED if classes else ChargeClass(fallback)


def current_lines(segment_lines: Sequence[LedgerLine]) -> list[LedgerLine]:
    """Each segment's latest charge, unless it was reversed since (then it has none)."""
    latest: dict[str, LedgerLine | None] = {}
    for line in segment_lines:  # in id order
        latest[line.segment_id] = line if line.entry == EntryKind.CHARGE else None
    return [line for line in latest.values() if line is not None]


def total_line(lines: Sequence[LedgerLine]) -> LedgerLine | None:
    """The job's current total: its last charge (an outcome corrected after close reverses the first)."""
    return next((x for x in reversed(lines) if x.scope == UsageScope.JOB and x.entry == EntryKind.CHARGE), None)


@dataclass(frozen=True)
class JobTotal:
    """A closed job's net: the sum of its segments' entries (its total line plus any later correction)."""

    gpu_seconds: Decimal
    billable_gpu_seconds: Decimal
    cost: Decimal
    list_cost: Decimal
    charge_class: ChargeClass
    segments: int
    total: LedgerLine
    corrected_after_close: bool


def job_total(total: LedgerLine, segment_lines: Sequence[LedgerLine]) -> JobTotal:
    current = current_lines(segment_lines)
    return JobTotal(
        gpu_seconds=sum((x.gpu_seconds for x in segment_lines), Decimal(0)),
        billable_gpu_seconds=sum((x.billable_gpu_seconds for x in segment_lines), Decimal(0)),
        cost=sum((x.cost for x in segment_lines), Decimal(0)),
        list_cost=sum((x.list_cost for x in segment_lines), Decimal(0)),
        charge_class=job_class_of({x.charge_class for x in current}, total.charge_class),
        segments=len(current), total=total, corrected_after_close=any(x.id > total.id for x in segment_lines))


@dataclass
class GpuTypeMonth:
    gpu_type: str
    gpu_hours: float = 0.0
    billable_gpu_hours: float = 0.0
    spend: Decimal = Decimal(0)


@dataclass(frozen=True)
class TenantMonth:
    tenant_id: str
    month: str
    jobs: int
    succeeded: int
    failed: int
    cancelled: int
    by_gpu_type: list[GpuTypeMonth]
    refunded: Decimal
    under_review: Decimal

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.jobs if self.jobs else None

    @property
    def gpu_hours(self) -> float:
        return sum(g.gpu_hours for g in self.by_gpu_type)

    @property
    def billable_gpu_hours(self) -> float:
        return sum(g.billable_gpu_hours for g in self.by_gpu_type)

    @property
    def spend(self) -> Decimal:
        return sum((g.spend for g in self.by_gpu_type), Decimal(0))


def tenant_month(tenant_id: str, month: str, usage: Sequence[MonthlyUsage], jobs: Mapping[str, int]) -> TenantMonth:
    """A tenant's month from its roll-ups: `usage` per GPU type and class, `jobs` per outcome."""
    by_gpu: dict[str, GpuTypeMonth] = {}
    for u in usage:
        g = by_gpu.setdefault(u.gpu_type, GpuTypeMonth(u.gpu_type))
        g.gpu_hours += float(u.gpu_seconds) / 3600
        g.billable_gpu_hours += float(u.billable_gpu_seconds) / 3600
        g.spend += u.cost

    def by_class(klass: ChargeClass) -> Decimal:
        return sum((u.list_cost for u in usage if u.charge_class == klass), Decimal(0))

    return TenantMonth(tenant_id, month, sum(jobs.values()), jobs.get(Outcome.SUCCEEDED, 0),
                       jobs.get(Outcome.FAILED, 0), jobs.get(Outcome.CANCELLED, 0),
                       sorted(by_gpu.values(), key=lambda g: g.gpu_type), by_class(ChargeClass.REFUNDED),
                       by_class(ChargeClass.REVIEW))
