"""TrackingStore: the registry's experiment-tracking tables (tracked_runs, tracking_items)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ..domain.tracking import TrackingItem


@dataclass(frozen=True)
class TrackedRun:
    job_id: str
    tenant_id: str
    experiment: str
    run_name: str
    start_ms: int
    experiment_id: str | None
    run_id: str | None
    attempts: int


@dataclass(frozen=True)
class PendingItem:
    item: str
    body: TrackingItem


class TrackingStore:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def track(self, job_id: str, tenant_id: str, experiment: str, run_name: str, start_ms: int) -> bool:
        """The job's run to be; False when it was tracked already (a redelivered or re-queued job.queued)."""
        status = await self.conn.execute(
            "INSERT INTO tracked_runs (job_id, tenant_id, experiment, run_name, start_ms) VALUES ($1,$2,$3,$4,$5)"
            " ON CONFLICT DO NOTHING", job_id, tenant_id, experiment, run_name, start_ms)
        return bool(status.endswith(" 1"))

    async def tracked(self, job_id: str) -> bool:
        return bool(await self.conn.fetchval("SELECT true FROM tracked_runs WHERE job_id = $1", job_id))

    async def job_known(self, job_id: str) -> bool:
        """The registry read the job's job.queued (tracked or not)."""
        return bool(await self.conn.fetchval("SELECT true FROM jobs WHERE job_id = $1", job_id))

    async def forget(self, job_id: str) -> None:
        """Items kept for a job before its job.queued, which turned out untracked."""
        await self.conn.execute("DELETE FROM tracking_items WHERE job_id = $1", job_id)

    async def add(self, job_id: str, item: str, body: TrackingItem) -> None:
        """Queue an item once: the same key again (a redelivered event) adds nothing."""
        await self.conn.execute(
            "INSERT INTO tracking_items (job_id, item, body) VALUES ($1,$2,$3) ON CONFLICT DO NOTHING",
            job_id, item, body.model_dump(mode="json", exclude_defaults=True))

    async def due(self, now: datetime, limit: int = 20) -> list[TrackedRun]:
        """Runs with items to send whose next try is due."""
        rows = await self.conn.fetch(
            "SELECT job_id, tenant_id, experiment, run_name, start_ms, experiment_id, run_id, attempts"
            " FROM tracked_runs r WHERE NOT given_up AND next_try_at <= $1 AND EXISTS"
            " (SELECT 1 FROM tracking_items i WHERE i.job_id = r.job_id AND i.sent_at IS NULL)"
            " ORDER BY next_try_at LIMIT $2", now, limit)
        return [TrackedRun(**dict(r)) for r in rows]

    async def pending(self, job_id: str, limit: int = 200) -> list[PendingItem]:
        rows = await self.conn.fetch(
            "SELECT item, body FROM tracking_items WHERE job_id = $1 AND sent_at IS NULL ORDER BY seq LIMIT $2",
            job_id, limit)
        return [PendingItem(r["item"], TrackingItem.model_validate(r["body"])) for r in rows]

    async def run_made(self, job_id: str, experiment_id: str, run_id: str) -> None:
        await self.conn.execute("UPDATE tracked_runs SET experiment_id = $2, run_id = $3 WHERE job_id = $1",
                                job_id, experiment_id, run_id)

    async def sent(self, job_id: str, items: list[str], now: datetime) -> None:
        await self.conn.execute(
            "UPDATE tracking_items SET sent_at = $3 WHERE job_id = $1 AND item = ANY($2::text[])", job_id, items, now)
        await self.conn.execute(
            "UPDATE tracked_runs SET attempts = 0, last_error = NULL WHERE job_id = $1", job_id)

    async def failed(self, job_id: str, error: str, next_try_at: datetime, give_up: bool) -> None:
        await self.conn.execute(
            "UPDATE tracked_runs SET attempts = attempts + 1, last_error = $2, next_try_at = $3, given_up = $4"
            " WHERE job_id = $1", job_id, error[:2000], next_try_at, give_up)

    async def state(self, job_id: str) -> tuple[str | None, bool, str | None] | None:
        """(run id, given up, last error) of a tracked job; None when it is not tracked."""
        row = await self.conn.fetchrow(
            "SELECT run_id, given_up, last_error FROM tracked_runs WHERE job_id = $1", job_id)
        return None if row is None else (row["run_id"], row["given_up"], row["last_error"])
