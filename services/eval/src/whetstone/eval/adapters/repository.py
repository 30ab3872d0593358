"""Postgres access for the eval service: projections, claims with leases, stage results, results."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg
from whetstone.contracts import EvalStageResult
from whetstone.runtime.leases import LeasedTable
from whetstone.runtime.observability import Probe

EVAL_RUNS = LeasedTable("eval_runs", "run_id")
# the queue behind the consumers: KEDA scales eval on it
PROBES = (Probe("whetstone_eval_runs_open", "Evaluations queued or running, by status", ("status",),
                "SELECT status, count(*)::float8 FROM eval_runs WHERE status IN ('pending', 'running')"
                " GROUP BY status"),)


class LeaseLost(RuntimeError):
    """Another worker owns this evaluation now (our lease ran out): stop, record nothing more."""


@dataclass(frozen=True)
class Claim:
    """A run held under a lease: a job's own evaluation (run_id = job_id, request None) or an
    `eval.requested` command (its payload in `request`)."""
    run_id: str
    tenant_id: str
    attempts: int
    owner: str
    job_id: str = ""
    request: dict | None = None
    trace_id: str | None = None


async def save_job(conn: asyncpg.Connection, job_id: str, tenant_id: str, spec: dict, tier: str | None) -> None:
    await conn.execute("INSERT INTO jobs (job_id, tenant_id, spec, tier) VALUES ($1, $2, $3, $4)"
                       " ON CONFLICT DO NOTHING", job_id, tenant_id, spec, tier)


def job_run_id(job_id: str, attempt: int | None) -> str:
    """A job's own evaluation: one run per attempt that wrote a final checkpoint."""
    return job_id if (attempt or 1) <= 1 else f"{job_id}~a{attempt}"


async def final_attempt(conn: asyncpg.Connection, job_id: str) -> int | None:
    """The attempt of the job's final checkpoint kept here (None: none kept)."""
    row = await conn.fetchrow("SELECT coalesce(attempt, 1) AS attempt FROM final_checkpoints WHERE job_id = $1", job_id)
    return row["attempt"] if row else None


async def save_final_checkpoint(conn: asyncpg.Connection, job_id: str, tenant_id: str, uri: str,
                                manifest_sha256: str, trace_id: str, attempt: int | None) -> None:
    """The job's final checkpoint; a newer attempt's replaces an older attempt's (never the reverse)."""
    await conn.execute(
        "INSERT INTO final_checkpoints (job_id, tenant_id, uri, manifest_sha256, trace_id, attempt)"
        " VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (job_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id,"
        " uri = EXCLUDED.uri, manifest_sha256 = EXCLUDED.manifest_sha256, trace_id = EXCLUDED.trace_id,"
        " attempt = EXCLUDED.attempt"
        " WHERE coalesce(final_checkpoints.attempt, 1) < coalesce(EXCLUDED.attempt, 1)",
        job_id, tenant_id, uri, manifest_sha256, trace_id, attempt)


async def supersede_runs(conn: asyncpg.Connection, job_id: str, tenant_id: str, up_to_attempt: int) -> int:
    """The job's own runs of attempts up to this one that have not published: they never will."""
    runs = [job_run_id(job_id, a) for a in range(1, up_to_attempt + 1)]
    status = await conn.execute(
        "UPDATE eval_runs SET status = 'superseded', lease_owner = NULL, lease_until = NULL, updated_at = now()"
        " WHERE run_id = ANY($1::text[]) AND tenant_id = $2 AND request IS NULL AND status IN ('pending', 'running')",
        runs, tenant_id)
    return int(status.split()[-1])


async def supersede_job_runs(conn: asyncpg.Connection, job_id: str, tenant_id: str) -> int:
    """The job was cancelled: every own run of it that has not published never will (any attempt)."""
    status = await conn.execute(
        "UPDATE eval_runs SET status = 'superseded', lease_owner = NULL, lease_until = NULL, updated_at = now()"
        " WHERE job_id = $1 AND tenant_id = $2 AND request IS NULL AND status IN ('pending', 'running')",
        job_id, tenant_id)
    return int(status.split()[-1])


async def forget_fenced_checkpoint(conn: asyncpg.Connection, job_id: str, tenant_id: str, fenced: int) -> bool:
    """A kept final checkpoint of a fenced attempt is not the job's result: drop it."""
    status = await conn.execute("DELETE FROM final_checkpoints WHERE job_id = $1 AND tenant_id = $2"
                                " AND coalesce(attempt, 1) <= $3", job_id, tenant_id, fenced)
    return status.endswith(" 1")


async def request_eval_if_ready(conn: asyncpg.Connection, job_id: str) -> bool:
    """Both the job and its final checkpoint known: add a pending evaluation (once per attempt). Cheap."""
    status = await conn.execute(
        "INSERT INTO eval_runs (run_id, job_id, tenant_id, trace_id)"
        " SELECT CASE WHEN coalesce(c.attempt, 1) <= 1 THEN j.job_id ELSE j.job_id || '~a' || c.attempt END,"
        " j.job_id, j.tenant_id, c.trace_id"
        " FROM jobs j JOIN final_checkpoints c USING (job_id) WHERE j.job_id = $1 ON CONFLICT DO NOTHING", job_id)
    return status.endswith(" 1")


async def add_request(conn: asyncpg.Connection, run_id: str, job_id: str, tenant_id: str, request: dict,
                      trace_id: str) -> bool:
    """An `eval.requested` command as a pending run (once per run id: a redelivery adds nothing). Cheap."""
    status = await conn.execute(
        "INSERT INTO eval_runs (run_id, job_id, tenant_id, request, trace_id) VALUES ($1, $2, $3, $4, $5)"
        " ON CONFLICT DO NOTHING", run_id, job_id, tenant_id, request, trace_id)
    return status.endswith(" 1")


async def claim_next(pool: asyncpg.Pool, owner: str, lease_s: float) -> Claim | None:
    """A pending evaluation, or a running one whose lease expired (its worker died)."""
    row = await EVAL_RUNS.claim_next(pool, owner, lease_s, "run_id, job_id, tenant_id, attempts, request, trace_id")
    if row is None:
        return None
    return Claim(row["run_id"], row["tenant_id"], row["attempts"], owner, job_id=row["job_id"],
                 request=row["request"], trace_id=row["trace_id"])


async def _hold_lease(conn: asyncpg.Connection, claim: Claim) -> None:
    owner = await conn.fetchval("SELECT lease_owner FROM eval_runs WHERE run_id = $1 AND status = 'running'"
                                " FOR UPDATE", claim.run_id)
    if owner != claim.owner:
        raise LeaseLost(f"evaluation {claim.run_id} is now owned by {owner}")


async def load_inputs(pool: asyncpg.Pool, claim: Claim) -> dict[str, Any]:
    """The job projection (None when eval never saw the job), its final checkpoint (job runs only) and the
    stages this run already recorded."""
    async with pool.acquire() as conn:
        job = await conn.fetchrow("SELECT * FROM jobs WHERE job_id = $1 AND tenant_id = $2", claim.job_id,
                                  claim.tenant_id)
        ckpt = None
        if claim.request is None:
            ckpt = await conn.fetchrow("SELECT * FROM final_checkpoints WHERE job_id = $1", claim.job_id)
        done = await conn.fetch("SELECT stage, result FROM eval_stage_results WHERE run_id = $1", claim.run_id)
    return {"job": dict(job) if job else None, "checkpoint": dict(ckpt) if ckpt else None,
            "done": {r["stage"]: EvalStageResult.model_validate(r["result"]) for r in done}}


async def last_accepted(pool: asyncpg.Pool, lineage_key: str, job_id: str) -> dict | None:
    row = await pool.fetchrow(
        "SELECT job_id, adapter_uri, adapter_manifest_sha256 FROM results WHERE lineage_key = $1"
        " AND verdict = 'passed' AND job_id <> $2 AND adapter_uri IS NOT NULL ORDER BY created_at DESC LIMIT 1",
        lineage_key, job_id)
    return dict(row) if row else None


async def record_stage(pool: asyncpg.Pool, claim: Claim, result: EvalStageResult) -> None:
    """Durable, short, and only while we still hold the lease."""
    async with pool.acquire() as conn, conn.transaction():
        await _hold_lease(conn, claim)
        await conn.execute("INSERT INTO eval_stage_results (run_id, stage, result) VALUES ($1, $2, $3)"
                           " ON CONFLICT (run_id, stage) DO UPDATE SET result = EXCLUDED.result, recorded_at = now()",
                           claim.run_id, result.name, result.model_dump(mode="json"))


async def record_failure(pool: asyncpg.Pool, claim: Claim, error: str) -> None:
    """A crashed attempt: back to pending. Any worker retries it; once the attempts are spent the next claim
    publishes a failed verdict instead."""
    await pool.execute("UPDATE eval_runs SET status = 'pending', lease_owner = NULL, last_error = $3,"
                       " transient_since = NULL, transient_retries = 0, updated_at = now()"
                       " WHERE run_id = $1 AND lease_owner = $2", claim.run_id, claim.owner, error[:2000])


async def record_transient_failure(pool: asyncpg.Pool, claim: Claim, error: str, *, backoff_s: float,
                                   backoff_max_s: float, budget_s: float) -> float | None:
    """An attempt that failed on an unreachable dependency: back to pending, claimable again only after a
    capped exponential pause, and the attempt is given back (not a crash) while the outage is younger than
    `budget_s`; after that it counts like a crash. The pause in seconds, or None once the budget is spent."""
    row = await pool.fetchrow(
        "UPDATE eval_runs SET status = 'pending', lease_owner = NULL, last_error = $3, updated_at = now(),"
        " transient_since = coalesce(transient_since, now()), transient_retries = transient_retries + 1,"
        " attempts = CASE WHEN now() - coalesce(transient_since, now()) < make_interval(secs => $6)"
        "                 THEN attempts - 1 ELSE attempts END,"
        " not_before = now() + make_interval(secs => least($5, $4 * power(2, transient_retries)))"
        " WHERE run_id = $1 AND lease_owner = $2"
        " RETURNING least($5, $4 * power(2, transient_retries - 1)) AS pause,"
        " now() - transient_since < make_interval(secs => $6) AS within",
        claim.run_id, claim.owner, error[:2000], backoff_s, backoff_max_s, budget_s)
    if row is None:
        return None
    return float(row["pause"]) if row["within"] else None


async def finish(conn: asyncpg.Connection, claim: Claim, *, lineage_key: str, verdict: str,
                 candidate_loss: float | None, adapter_uri: str, adapter_manifest_sha256: str, event: dict) -> bool:
    """Inside the final short transaction (with the outbox publish): result row, run done. A run whose
    checkpoint is no longer the job's (its attempt was fenced or superseded meanwhile) ends
    'superseded' and publishes nothing."""
    await _hold_lease(conn, claim)
    current = await conn.fetchval("SELECT uri FROM final_checkpoints WHERE job_id = $1 FOR SHARE", claim.job_id)
    if current != adapter_uri:
        await conn.execute("UPDATE eval_runs SET status = 'superseded', lease_until = NULL, updated_at = now()"
                           " WHERE run_id = $1", claim.run_id)
        return False
    status = await conn.execute(
        "INSERT INTO results (job_id, tenant_id, lineage_key, verdict, candidate_loss, event, adapter_uri,"
        " adapter_manifest_sha256) VALUES ($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (job_id) DO UPDATE"
        " SET verdict = EXCLUDED.verdict, candidate_loss = EXCLUDED.candidate_loss, event = EXCLUDED.event,"
        " adapter_uri = EXCLUDED.adapter_uri, adapter_manifest_sha256 = EXCLUDED.adapter_manifest_sha256,"
        " created_at = now() WHERE results.adapter_uri IS DISTINCT FROM EXCLUDED.adapter_uri",   # a newer attempt
        claim.job_id, claim.tenant_id, lineage_key, verdict, candidate_loss, event, adapter_uri,
        adapter_manifest_sha256)
    await _done(conn, claim, verdict)
    return status.endswith(" 1")


async def finish_request(conn: asyncpg.Connection, claim: Claim, *, verdict: str) -> bool:
    """Inside the final short transaction of a command's run: done (the lease check makes it once)."""
    await _hold_lease(conn, claim)
    await _done(conn, claim, verdict)
    return True


async def _done(conn: asyncpg.Connection, claim: Claim, verdict: str) -> None:
    await conn.execute("UPDATE eval_runs SET status = 'done', verdict = $2, lease_until = NULL, updated_at = now()"
                       " WHERE run_id = $1", claim.run_id, verdict)


class PgScoreCache:
    """The ScoreCache of base-side scores in Postgres, used from the worker thread."""

    def __init__(self, pool: asyncpg.Pool, loop):
        self.pool, self.loop = pool, loop

    def _run(self, coro):
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def get(self, key: str) -> dict | None:
        value = self._run(self.pool.fetchval("SELECT value FROM base_scores WHERE key = $1", key))
        return json.loads(value) if isinstance(value, str) else value

    def put(self, key: str, value: dict) -> None:
        self._run(self.pool.execute("INSERT INTO base_scores (key, value) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                                    key, value))
