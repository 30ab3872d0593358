"""The usage API's answers, as declared in its OpenAPI document. Amounts are floats in USD,
timestamps ISO 8601 text."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, JsonValue

from whetstone.contracts.enums import ChargeClass, UsageScope

from ..domain.kinds import EntryKind, Outcome, ReviewDecision
from ..domain.usage import AnomalyRecord, AuditEvent, HeldJob, JobTotal, LedgerLine, TenantMonth, WaitingSegment
from ..usecases.usage import JobUsage


class Line(BaseModel):
    id: int
    scope: UsageScope
    segment_id: str | None
    entry: EntryKind
    revision: int
    gpu_type: str | None
    gpu_count: int
    spot: bool | None
    tier: str
    gpu_seconds: float
    billable_gpu_seconds: float
    rate_per_gpu_hour: float
    cost: float
    list_cost: float
    charge_class: ChargeClass
    price_version: str
    period: str
    basis: str
    currency: Literal["USD"] = "USD"
    source_events: list[str]
    usage_event_id: str
    created_at: str

    @classmethod
    def of(cls, x: LedgerLine) -> Line:
        return cls(id=x.id, scope=x.scope, segment_id=x.segment_id or None, entry=x.entry, revision=x.revision,
                   gpu_type=x.gpu_type, gpu_count=x.gpu_count, spot=x.spot, tier=x.tier,
                   gpu_seconds=float(x.gpu_seconds), billable_gpu_seconds=float(x.billable_gpu_seconds),
                   rate_per_gpu_hour=float(x.rate), cost=float(x.cost), list_cost=float(x.list_cost),
                   charge_class=x.charge_class, price_version=x.price_version, period=x.period, basis=x.basis,
                   source_events=list(x.source_events), usage_event_id=x.usage_event_id,
                   created_at=x.created_at.isoformat())


class Total(BaseModel):
    """A closed job's net: the sum of its segments' entries (its total line plus any later correction)."""

    gpu_seconds: float
    billable_gpu_seconds: float
    cost: float
    list_cost: float
    charge_class: ChargeClass
    currency: Literal["USD"] = "USD"
    segments: int
    outcome: Outcome | None
    price_version: str
    closed_at: str
    total_line_id: int
    corrected_after_close: bool

    @classmethod
    def of(cls, t: JobTotal) -> Total:
        return cls(gpu_seconds=float(t.gpu_seconds), billable_gpu_seconds=float(t.billable_gpu_seconds),
                   cost=float(t.cost), list_cost=float(t.list_cost), charge_class=t.charge_class,
                   segments=t.segments, outcome=t.total.outcome, price_version=t.total.price_version,
                   closed_at=t.total.created_at.isoformat(), total_line_id=t.total.id,
                   corrected_after_close=t.corrected_after_close)


class Waiting(BaseModel):
    segment_id: str
    started: bool
    stopped: bool

    @classmethod
    def of(cls, w: WaitingSegment) -> Waiting:
        return cls(segment_id=w.segment_id, started=w.started, stopped=w.stopped)


class Anomaly(BaseModel):
    segment_id: str
    code: str
    reason: str
    event_ids: list[str]
    created_at: str
    resolved_at: str | None
    resolution: str | None

    @classmethod
    def of(cls, a: AnomalyRecord) -> Anomaly:
        return cls(segment_id=a.segment_id, code=a.code, reason=a.reason, event_ids=list(a.event_ids),
                   created_at=a.created_at.isoformat(),
                   resolved_at=a.resolved_at.isoformat() if a.resolved_at else None, resolution=a.resolution)


class TenantAnomaly(Anomaly):
    job_id: str
    tenant_id: str

    @classmethod
    def of(cls, a: AnomalyRecord) -> TenantAnomaly:
        return cls(job_id=a.job_id, tenant_id=a.tenant_id, **Anomaly.of(a).model_dump())


class JobUsageOut(BaseModel):
    job_id: str
    tenant_id: str
    status: Literal["open", "closed"]
    total: Total | None
    lines: list[Line]
    entries: list[Line]
    waiting_segments: list[Waiting]
    anomalies: list[Anomaly]

    @classmethod
    def of(cls, u: JobUsage) -> JobUsageOut:
        return cls(job_id=u.job_id, tenant_id=u.tenant_id, status="closed" if u.total else "open",
                   total=Total.of(u.total) if u.total else None, lines=[Line.of(x) for x in u.lines],
                   entries=[Line.of(x) for x in u.entries], waiting_segments=[Waiting.of(w) for w in u.waiting],
                   anomalies=[Anomaly.of(a) for a in u.anomalies])


class StoredEnvelope(BaseModel):
    """What the audit shows of a stored message (a lifecycle envelope or a review record)."""

    producer: str | None = None
    trace_id: str | None = None
    payload: JsonValue = None


class AuditEventOut(BaseModel):
    event_id: str
    event_type: str
    segment_id: str | None
    occurred_at: str
    received_at: str
    producer: str | None
    trace_id: str | None
    payload: JsonValue

    @classmethod
    def of(cls, e: AuditEvent) -> AuditEventOut:
        envelope = StoredEnvelope.model_validate_json(e.envelope)
        return cls(event_id=e.event_id, event_type=e.event_type, segment_id=e.segment_id,
                   occurred_at=e.occurred_at.isoformat(), received_at=e.received_at.isoformat(),
                   producer=envelope.producer, trace_id=envelope.trace_id, payload=envelope.payload)


class LineEvents(BaseModel):
    line: Line
    events: list[AuditEventOut]


class GpuTypeUsage(BaseModel):
    gpu_type: str
    gpu_hours: float
    billable_gpu_hours: float
    spend: float


class MonthUsage(BaseModel):
    tenant_id: str
    month: str
    currency: Literal["USD"] = "USD"
    jobs: int
    succeeded: int
    failed: int
    cancelled: int
    success_rate: float | None
    gpu_hours: float
    billable_gpu_hours: float
    spend: float
    refunded: float
    under_review: float
    by_gpu_type: list[GpuTypeUsage]

    @classmethod
    def of(cls, m: TenantMonth) -> MonthUsage:
        return cls(tenant_id=m.tenant_id, month=m.month, jobs=m.jobs, succeeded=m.succeeded, failed=m.failed,
                   cancelled=m.cancelled, success_rate=m.success_rate, gpu_hours=m.gpu_hours,
                   billable_gpu_hours=m.billable_gpu_hours, spend=float(m.spend), refunded=float(m.refunded),
                   under_review=float(m.under_review),
                   by_gpu_type=[GpuTypeUsage(gpu_type=g.gpu_type, gpu_hours=g.gpu_hours,
                                             billable_gpu_hours=g.billable_gpu_hours, spend=float(g.spend))
                                for g in m.by_gpu_type])


class Anomalies(BaseModel):
    data: list[TenantAnomaly]


class HeldForReview(BaseModel):
    job_id: str
    tenant_id: str
    segments: int
    held_usd: float

    @classmethod
    def of(cls, h: HeldJob) -> HeldForReview:
        return cls(job_id=h.job_id, tenant_id=h.tenant_id, segments=h.segments, held_usd=float(h.held))


class Reviews(BaseModel):
    data: list[HeldForReview]


class ReviewBody(BaseModel):
    decision: ReviewDecision
    note: str = Field(default="", max_length=2000)


class ReviewDone(BaseModel):
    job_id: str
    decision: ReviewDecision
    entries: int
