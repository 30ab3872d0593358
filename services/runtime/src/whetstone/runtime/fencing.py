"""Fenced attempts, as every consumer of the trainer's results keeps them (eval, registry).

The scheduler fences a job's attempt when it gives up on its node (`node.fenced`, the attempt
inside) and re-assigns the job as the next attempt. Whatever the fenced attempt writes later (a
final checkpoint, a completion) must have no effect anywhere: a consumer records the highest
fenced attempt per job and refuses the stale attempt's events (`stale_attempt`).

A cancelled job is fenced whole (`CANCELLED`, above every attempt): `job.cancelled` voids every
attempt, earlier or later, so nothing of a cancelled job is evaluated or registered.

Events from producers older than attempts carry none: they count as attempt 1. The runtime has
already refused a fence naming another tenant than the job's owner (`tenancy.check_tenant`); the
fence is kept per tenant all the same, so it only ever counts for that tenant's events.
"""

from __future__ import annotations

import asyncpg

# the table each consumer's schema gets (in its own migrations)
FENCES_DDL = """
    CREATE TABLE fences (
        job_id     text NOT NULL,
        tenant_id  text NOT NULL,
        attempt    int NOT NULL,          -- attempts up to this one were fenced by the scheduler
        fenced_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (job_id, tenant_id)
    );
"""


CANCELLED = 2**31 - 1   # the fence a cancel records: every attempt of the job (int4's largest value)


def cancelled(fenced: int) -> bool:
    return fenced >= CANCELLED


def attempt_or_first(attempt: int | None) -> int:
    return attempt if attempt is not None else 1


async def record_fence(conn: asyncpg.Connection, job_id: str, tenant_id: str, attempt: int) -> int:
    """Remember the fence (a redelivered or older one changes nothing); the job's highest fenced attempt."""
    highest: int = await conn.fetchval(
        "INSERT INTO fences (job_id, tenant_id, attempt) VALUES ($1, $2, $3) ON CONFLICT (job_id, tenant_id)"
        " DO UPDATE SET attempt = greatest(fences.attempt, EXCLUDED.attempt) RETURNING attempt",
        job_id, tenant_id, attempt)
    return highest


async def fenced_attempt(conn: asyncpg.Connection, job_id: str, tenant_id: str) -> int:
    """The job's highest attempt fenced in this tenant's name; 0 when none was."""
    return await conn.fetchval("SELECT attempt FROM fences WHERE job_id = $1 AND tenant_id = $2",
                               job_id, tenant_id) or 0


def stale_reason(job_id: str, attempt: int | None, fenced: int, newest_known: int | None = None) -> str | None:
    """Why an event of this attempt must have no effect, or None."""
    seen = attempt_or_first(attempt)
    if cancelled(fenced):
        return f"job {job_id} was cancelled"
    if seen <= fenced:
        return f"attempt {seen} of job {job_id} was fenced by the scheduler (its node was given up on)"
    if newest_known is not None and seen < newest_known:
        return f"attempt {seen} of job {job_id} was superseded by attempt {newest_known}"
    return None
