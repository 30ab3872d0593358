"""What the usage API answers: a job's ledger, the events behind a line, a tenant's month, and the
operator's views (open anomalies, jobs held for review). Reads only."""

from __future__ import annotations

from dataclasses import dataclass

from whetstone.contracts.enums import UsageScope
from whetstone.runtime.service import Runtime

from ..adapters.usage_store import UsageStore
from ..context import MeteringContext
from ..domain.usage import (
    AnomalyRecord, AuditEvent, HeldJob, JobTotal, LedgerLine, TenantMonth, WaitingSegment, current_lines, job_total,
    tenant_month, total_line,
)


@dataclass(frozen=True)
class JobUsage:
    job_id: str
    tenant_id: str
    entries: list[LedgerLine]         # every append-only row, in id order
    lines: list[LedgerLine]           # each segment's current charge
    total: JobTotal | None            # once the job is closed
    waiting: list[WaitingSegment]
    anomalies: list[AnomalyRecord]


async def job_usage(rt: Runtime[MeteringContext], job_id: str, tenant_id: str) -> JobUsage | None:
    """The tenant's job's usage; None when metering has seen nothing of it (or it is another tenant's)."""
    async with rt.uow() as uow:
        store = UsageStore(uow.conn)
        entries = await store.job_lines(job_id, tenant_id)
        known = await store.job_known(job_id, tenant_id)
        waiting = await store.waiting_segments(job_id, tenant_id)
        anomalies = await store.job_anomalies(job_id, tenant_id)
    if not known:
        return None
    segment_lines = [x for x in entries if x.scope == UsageScope.SEGMENT]
    total = total_line(entries)
    return JobUsage(job_id, tenant_id, entries, current_lines(segment_lines),
                    job_total(total, segment_lines) if total else None, waiting, anomalies)


async def line_audit(rt: Runtime[MeteringContext], line_id: int,
                     tenant_id: str) -> tuple[LedgerLine, list[AuditEvent]] | None:
    """A ledger line and the events that produced it; None when the tenant has no such line."""
    async with rt.uow() as uow:
        store = UsageStore(uow.conn)
        line = await store.line(line_id, tenant_id)
        if line is None:
            return None
        return line, await store.events_of(line)


async def month_usage(rt: Runtime[MeteringContext], tenant_id: str, month: str) -> TenantMonth:
    async with rt.uow() as uow:
        usage, jobs = await UsageStore(uow.conn).month(tenant_id, month)
    return tenant_month(tenant_id, month, usage, jobs)


async def open_anomalies(rt: Runtime[MeteringContext], limit: int) -> list[AnomalyRecord]:
    async with rt.uow() as uow:
        return await UsageStore(uow.conn).open_anomalies(limit)


async def held_for_review(rt: Runtime[MeteringContext], limit: int) -> list[HeldJob]:
    async with rt.uow() as uow:
        return await UsageStore(uow.conn).held_for_review(limit)
