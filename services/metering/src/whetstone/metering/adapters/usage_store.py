"""The usage API's reads of the ledger, anomalies, waiting segments and monthly roll-ups,
returned as the records of domain/usage.py."""

from __future__ import annotations

import asyncpg

from whetstone.contracts.enums import ChargeClass

from ..domain.usage import AnomalyRecord, AuditEvent, HeldJob, LedgerLine, MonthlyUsage, WaitingSegment
from .rows import from_record, from_records

EVENT_COLUMNS = "event_id, event_type, job_id, segment_id, tenant_id, occurred_at, received_at, envelope"
ANOMALY_COLUMNS = "job_id, tenant_id, segment_id, code, reason, event_ids, created_at, resolved_at, resolution"


class UsageStore:
    """Every read but the operator's names the tenant: another tenant's rows are never returned."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def job_known(self, job_id: str, tenant_id: str) -> bool:
        return bool(await self.conn.fetchval("SELECT 1 FROM jobs WHERE job_id = $1 AND tenant_id = $2", job_id,
                                             tenant_id))

    async def job_lines(self, job_id: str, tenant_id: str) -> list[LedgerLine]:
        """The job's ledger rows in id order."""
        rows = await self.conn.fetch("SELECT * FROM ledger WHERE job_id = $1 AND tenant_id = $2 ORDER BY id",
                                     job_id, tenant_id)
        return from_records(LedgerLine, rows)

    async def waiting_segments(self, job_id: str, tenant_id: str) -> list[WaitingSegment]:
        rows = await self.conn.fetch(
            "SELECT segment_id, start IS NOT NULL AS started, stop IS NOT NULL AS stopped FROM segments"
            " WHERE job_id = $1 AND tenant_id = $2 AND waiting ORDER BY segment_id", job_id, tenant_id)
        return from_records(WaitingSegment, rows)

    async def job_anomalies(self, job_id: str, tenant_id: str) -> list[AnomalyRecord]:
        rows = await self.conn.fetch(f"SELECT {ANOMALY_COLUMNS} FROM anomalies WHERE job_id = $1 AND tenant_id = $2"
                                     " ORDER BY id", job_id, tenant_id)
        return from_records(AnomalyRecord, rows)

    async def line(self, line_id: int, tenant_id: str) -> LedgerLine | None:
        row = await self.conn.fetchrow("SELECT * FROM ledger WHERE id = $1 AND tenant_id = $2", line_id, tenant_id)
        return None if row is None else from_record(LedgerLine, row)

    async def events_of(self, line: LedgerLine) -> list[AuditEvent]:
        """The events that produced a ledger line, in the order they happened."""
        rows = await self.conn.fetch(
            f"SELECT {EVENT_COLUMNS} FROM events"
            " WHERE job_id = $1 AND event_id = ANY($2::text[]) ORDER BY occurred_at, event_id",
            line.job_id, list(line.source_events))
        return from_records(AuditEvent, rows)

    async def month(self, tenant_id: str, period: str) -> tuple[list[MonthlyUsage], dict[str, int]]:
        """A tenant's month: its usage per GPU type and charge class, and its finished jobs per outcome."""
        usage = await self.conn.fetch(
            "SELECT gpu_type, charge_class, segments, gpu_seconds, billable_gpu_seconds, cost, list_cost"
            " FROM usage_monthly WHERE tenant_id = $1 AND period = $2", tenant_id, period)
        jobs = await self.conn.fetch("SELECT outcome, jobs FROM jobs_monthly WHERE tenant_id = $1 AND period = $2",
                                     tenant_id, period)
        return from_records(MonthlyUsage, usage), {outcome: n for outcome, n in jobs}

    async def open_anomalies(self, limit: int) -> list[AnomalyRecord]:
        """Every tenant's unresolved anomalies, oldest first (the operator's view)."""
        rows = await self.conn.fetch(f"SELECT {ANOMALY_COLUMNS} FROM anomalies WHERE resolved_at IS NULL"
                                     " ORDER BY id LIMIT $1", limit)
        return from_records(AnomalyRecord, rows)

    async def held_for_review(self, limit: int) -> list[HeldJob]:
        """Every tenant's jobs with segments held for review (the operator's view)."""
        rows = await self.conn.fetch(
            "SELECT job_id, tenant_id, count(*) AS segments, sum((billed->>'list_cost')::numeric) AS held"
            " FROM segments WHERE billed->>'charge_class' = $2 GROUP BY 1, 2 ORDER BY 1 LIMIT $1", limit,
            ChargeClass.REVIEW.value)
        return from_records(HeldJob, rows)
