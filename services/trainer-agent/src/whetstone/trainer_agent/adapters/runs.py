"""The agent's `runs` table: the only place with SQL. Every method runs on the caller's
connection (inside its unit of work), so a state change and the events it publishes commit together.

    assigned --claim--> running --finish--> finished (completed | failed | preempted | worker_done)
       |                   `--agent restart--> interrupted
       `--cancel--> cancelled, or --hand back (agent stopping)--> finished (preempted)
    assigned | running --node.fenced--> finished (fenced): final, nothing the segment does later changes it

A job cancelled here is remembered (`cancelled_jobs`): an assignment of it recorded afterwards is
cancelled on arrival and never claimed. So is a fenced attempt (`fenced_attempts`): its assignment
recorded afterwards is finished (fenced) on arrival. Both are forgotten with the inbox (bootstrap.py).
"""

from __future__ import annotations

from dataclasses import asdict

import asyncpg
from pydantic import TypeAdapter
from whetstone.contracts import TOLERANT, Envelope, JobAssignedV1

from ..domain.runs import Run, RunStatus, RunUpdate

_RUN: TypeAdapter[Run] = TypeAdapter(Run)


def _run(row: asyncpg.Record) -> Run:
    """A `runs` row as a Run, field by field (the row's other columns are the table's own)."""
    return _RUN.validate_python(dict(row), context=TOLERANT)


class RunStore:
    async def add_assignment(self, conn: asyncpg.Connection, env: Envelope, ev: JobAssignedV1) -> RunStatus | None:
        """Record an assignment: `assigned`, to be claimed; `cancelled` when the job's cancel came first;
        `finished` (outcome fenced) when the attempt's fence came first. None when it was recorded
        before (a redelivery changes nothing)."""
        status = await conn.fetchval(
            "INSERT INTO runs (segment_id, job_id, node_id, tenant_id, trace_id, attempt, gpu_ids, spec, resume_from,"
            " rendezvous, status, outcome, finished_at) SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10,"
            " CASE WHEN c.job_id IS NOT NULL THEN 'cancelled' WHEN f.job_id IS NOT NULL THEN 'finished'"
            " ELSE 'assigned' END,"
            " CASE WHEN c.job_id IS NULL AND f.job_id IS NOT NULL THEN 'fenced' END,"
            " CASE WHEN c.job_id IS NULL AND f.job_id IS NULL THEN NULL ELSE now() END"
            " FROM (SELECT 1) one LEFT JOIN cancelled_jobs c ON c.job_id = $2 AND c.tenant_id = $4"
            " LEFT JOIN fenced_attempts f ON f.job_id = $2 AND f.node_id = $3 AND f.attempt = $6"
            " ON CONFLICT DO NOTHING RETURNING status",
            ev.segment_id, ev.job_id, ev.node_id, env.tenant_id, env.trace_id, ev.attempt, ev.gpu_ids,
            ev.spec.model_dump(mode="json"), ev.resume_from.model_dump(mode="json") if ev.resume_from else None,
            ev.rendezvous.model_dump(mode="json") if ev.rendezvous else None)
        return None if status is None else RunStatus(status)

    async def remember_cancel(self, conn: asyncpg.Connection, job_id: str, tenant_id: str,
                              attempt: int | None) -> None:
        """The job was cancelled: no assignment of it runs here from now on (the record outlives the
        job's runs: an assignment may arrive long after its cancel)."""
        await conn.execute("INSERT INTO cancelled_jobs (job_id, tenant_id, attempt) VALUES ($1, $2, $3)"
                           " ON CONFLICT (job_id) DO NOTHING", job_id, tenant_id, attempt)

    async def hand_back(self, conn: asyncpg.Connection, segment_id: str, node_id: str) -> bool:
        """An assignment not started yet ends as preempted; False when it had started (or ended)."""
        return bool(await conn.fetchval(
            "UPDATE runs SET status = 'finished', outcome = 'preempted', finished_at = now()"
            " WHERE segment_id = $1 AND node_id = $2 AND status = 'assigned' RETURNING segment_id", segment_id,
            node_id))

    async def hand_back_all(self, conn: asyncpg.Connection, node_id: str) -> list[Run]:
        rows = await conn.fetch(
            "UPDATE runs SET status = 'finished', outcome = 'preempted', finished_at = now()"
            " WHERE node_id = $1 AND status = 'assigned' RETURNING *", node_id)
        return [_run(r) for r in rows]

    async def cancel_assigned(self, conn: asyncpg.Connection, job_id: str, node_id: str) -> list[int]:
        """Assignments of the job not started yet are dropped; returns their attempts."""
        rows = await conn.fetch(
            "UPDATE runs SET status = 'cancelled', finished_at = now() WHERE job_id = $1 AND node_id = $2"
            " AND status = 'assigned' RETURNING attempt", job_id, node_id)
        return [int(attempt) for (attempt,) in rows]

    async def fence(self, conn: asyncpg.Connection, node_id: str, job_id: str, attempt: int,
                    segment_id: str | None) -> list[Run]:
        """The scheduler fenced this attempt: its runs not finished yet end as fenced; returns them
        (none when it is not ours, or already ended: a redelivered command changes nothing). The fence
        is remembered for an assignment of the attempt still to arrive."""
        await conn.execute("INSERT INTO fenced_attempts (job_id, node_id, attempt) VALUES ($1, $2, $3)"
                           " ON CONFLICT DO NOTHING", job_id, node_id, attempt)
        rows = await conn.fetch(
            "UPDATE runs SET status = 'finished', outcome = 'fenced', finished_at = now()"
            " WHERE node_id = $1 AND job_id = $2 AND attempt = $3 AND ($4::text IS NULL OR segment_id = $4)"
            " AND status IN ('assigned', 'running') RETURNING *", node_id, job_id, attempt, segment_id)
        return [_run(r) for r in rows]

    async def running_count(self, conn: asyncpg.Connection, job_id: str, node_id: str) -> int:
        return int(await conn.fetchval(
            "SELECT count(*) FROM runs WHERE job_id = $1 AND node_id = $2 AND status = 'running'", job_id, node_id))

    async def claim_assigned(self, conn: asyncpg.Connection, node_id: str) -> list[Run]:
        """Assignments to start now (never one of a job cancelled here)."""
        rows = await conn.fetch("UPDATE runs r SET status = 'running', started_at = now()"
                                " WHERE node_id = $1 AND status = 'assigned' AND NOT EXISTS"
                                " (SELECT 1 FROM cancelled_jobs c WHERE c.job_id = r.job_id) RETURNING *", node_id)
        return [_run(r) for r in rows]

    async def interrupt_running(self, conn: asyncpg.Connection, node_id: str) -> list[Run]:
        """Runs left 'running' by an agent that was killed outright."""
        rows = await conn.fetch("UPDATE runs SET status = 'interrupted', finished_at = now()"
                                " WHERE node_id = $1 AND status = 'running' RETURNING *", node_id)
        return [_run(r) for r in rows]

    async def update(self, conn: asyncpg.Connection, segment_id: str, node_id: str, change: RunUpdate) -> None:
        """This node's run of the segment (a gang's nodes each run the same segment id)."""
        columns = {name: value for name, value in asdict(change).items() if value is not None}
        if change.latest_checkpoint is not None:
            columns["latest_checkpoint"] = change.latest_checkpoint.model_dump(mode="json")
        if not columns:
            return
        sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(columns, start=3))
        # a fenced run stays fenced: what its segment still records afterwards is dropped
        await conn.execute(f"UPDATE runs SET {sets} WHERE segment_id = $1 AND node_id = $2"
                           " AND outcome IS DISTINCT FROM 'fenced'", segment_id, node_id, *columns.values())
