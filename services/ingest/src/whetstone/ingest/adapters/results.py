"""ResultsStore: the figures of each job's steps as job.progress / checkpoint.written reported them, and what
became of the job's results file (made once, or never for a cancelled job)."""

from __future__ import annotations

from typing import Any, Literal

import asyncpg

FileState = Literal["none", "made", "cancelled"]


class ResultsStore:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def record(self, tenant_id: str, job_id: str, step: int, attempt: int, values: dict[str, float]) -> None:
        """Merge a step's figures; a later attempt's report of the step replaces an earlier attempt's."""
        await self.conn.execute(
            "INSERT INTO job_step_metrics (tenant_id, job_id, step, attempt, metrics) VALUES ($1,$2,$3,$4,$5)"
            " ON CONFLICT (tenant_id, job_id, step) DO UPDATE SET attempt = EXCLUDED.attempt,"
            " metrics = CASE WHEN EXCLUDED.attempt > job_step_metrics.attempt THEN EXCLUDED.metrics"
            "                ELSE job_step_metrics.metrics || EXCLUDED.metrics END"
            " WHERE EXCLUDED.attempt >= job_step_metrics.attempt", tenant_id, job_id, step, attempt, values)

    async def rows(self, tenant_id: str, job_id: str) -> list[tuple[int, int, dict[str, Any]]]:
        rows = await self.conn.fetch("SELECT step, attempt, metrics FROM job_step_metrics WHERE tenant_id = $1"
                                     " AND job_id = $2 ORDER BY step", tenant_id, job_id)
        return [(step, attempt, dict(metrics)) for step, attempt, metrics in rows]

    async def state(self, tenant_id: str, job_id: str) -> FileState:
        row = await self.conn.fetchrow("SELECT file_id FROM job_result_files WHERE tenant_id = $1 AND job_id = $2"
                                       " FOR UPDATE", tenant_id, job_id)
        if row is None:
            return "none"
        (file_id,) = row
        return "made" if file_id else "cancelled"

    async def claim(self, tenant_id: str, job_id: str, file_id: str) -> bool:
        """True the first time a results file is made for this job (never after a cancel)."""
        return bool(await self.conn.fetchval(
            "INSERT INTO job_result_files (tenant_id, job_id, file_id) VALUES ($1,$2,$3) ON CONFLICT DO NOTHING"
            " RETURNING 1", tenant_id, job_id, file_id))

    async def training_ended(self, tenant_id: str, job_id: str) -> None:
        """Training ended with no figures read yet: the first ones read make the file."""
        await self.conn.execute("INSERT INTO job_training_ended (tenant_id, job_id) VALUES ($1,$2)"
                                " ON CONFLICT DO NOTHING", tenant_id, job_id)

    async def ended(self, tenant_id: str, job_id: str) -> bool:
        return bool(await self.conn.fetchval("SELECT 1 FROM job_training_ended WHERE tenant_id = $1 AND job_id = $2",
                                             tenant_id, job_id))

    async def cancelled(self, tenant_id: str, job_id: str) -> None:
        """A cancelled job makes no results file: its figures go, and later reports are dropped."""
        await self.conn.execute("INSERT INTO job_result_files (tenant_id, job_id, file_id) VALUES ($1,$2,NULL)"
                                " ON CONFLICT DO NOTHING", tenant_id, job_id)
        await self.conn.execute("DELETE FROM job_step_metrics WHERE tenant_id = $1 AND job_id = $2", tenant_id, job_id)

    async def rewritten(self, tenant_id: str, file_id: str, size: int, sha256: str) -> bool:
        """The file row follows content rewritten in place (unless the tenant deleted the file)."""
        return bool(await self.conn.fetchval(
            "UPDATE files SET bytes = $3, sha256 = $4 WHERE tenant_id = $1 AND file_id = $2 AND deleted_at IS NULL"
            " RETURNING 1", tenant_id, file_id, size, sha256))
