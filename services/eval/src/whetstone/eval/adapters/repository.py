"""Postgres access for the eval service: `EvalStore` (projections, runs under leases, stage results,
results) on the connection of the caller's transaction, and the base-score cache. SQL, column names
and the row <-> object mapping live here only."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

import asyncpg
from pydantic import JsonValue
from whetstone.contracts import (
    TOLERANT,
    EvalCompletedV1,
    EvalRequestedV1,
    EvalStageResult,
    TrainingSpec,
)
from whetstone.runtime.leases import LeasedTable
from whetstone.runtime.observability import Probe

from ..domain.runs import (
    AcceptedAdapter,
    Claim,
    EvalJob,
    FinalCheckpoint,
    RunInputs,
    RunStatus,
    job_run_id,
)

T = TypeVar("T")
EVAL_RUNS = LeasedTable("eval_runs", "run_id")
# the queue behind the consumers: KEDA scales eval on it
PROBES = (Probe("whetstone_eval_runs_open", "Evaluations queued or running, by status", ("status",),
                "SELECT status, count(*)::float8 FROM eval_runs WHERE status IN ('pending', 'running')"
                " GROUP BY status"),)


class LeaseLost(RuntimeError):
    """Another worker owns this evaluation now (our lease ran out): stop, record nothing more."""


def _count(status: str) -> int:
    """The row count of an INSERT/UPDATE/DELETE command status."""
    return int(status.split()[-1])


def _job(row: asyncpg.Record) -> EvalJob:
    fields = dict(row)
    return EvalJob(spec=TrainingSpec.model_validate(fields.pop("spec"), context=TOLERANT), **fields)


def _claim(row: asyncpg.Record, owner: str) -> Claim:
    fields = dict(row)
    request = fields.pop("request")
    return Claim(owner=owner, **fields,
                 request=None if request is None else EvalRequestedV1.model_validate(request, context=TOLERANT))


class EvalStore:
    """The eval service's tables, on one connection (inside the caller's transaction where it has one)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    # ------------------------------------------------------------ projections
    async def save_job(self, job: EvalJob) -> None:
        await self.conn.execute("INSERT INTO jobs (job_id, tenant_id, spec, tier, suffix) VALUES ($1, $2, $3, $4, $5)"
                                " ON CONFLICT DO NOTHING", job.job_id, job.tenant_id,
                                job.spec.model_dump(mode="json"), job.tier, job.suffix)

    async def final_attempt(self, job_id: str) -> int | None:
        """The attempt of the job's final checkpoint kept here (None: none kept)."""
        attempt: int | None = await self.conn.fetchval(
            "SELECT coalesce(attempt, 1) FROM final_checkpoints WHERE job_id = $1", job_id)
        return attempt

    async def save_final_checkpoint(self, ckpt: FinalCheckpoint) -> None:
        """The job's final checkpoint; a newer attempt's replaces an older attempt's (never the reverse)."""
        await self.conn.execute(
            "INSERT INTO final_checkpoints (job_id, tenant_id, uri, manifest_sha256, trace_id, attempt)"
            " VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (job_id) DO UPDATE SET tenant_id = EXCLUDED.tenant_id,"
            " uri = EXCLUDED.uri, manifest_sha256 = EXCLUDED.manifest_sha256, trace_id = EXCLUDED.trace_id,"
            " attempt = EXCLUDED.attempt"
            " WHERE coalesce(final_checkpoints.attempt, 1) < coalesce(EXCLUDED.attempt, 1)",
            ckpt.job_id, ckpt.tenant_id, ckpt.uri, ckpt.manifest_sha256, ckpt.trace_id, ckpt.attempt)

    async def forget_fenced_checkpoint(self, job_id: str, tenant_id: str, fenced: int) -> bool:
        """A kept final checkpoint of a fenced attempt is not the job's result: drop it."""
        status = await self.conn.execute("DELETE FROM final_checkpoints WHERE job_id = $1 AND tenant_id = $2"
                                         " AND coalesce(attempt, 1) <= $3", job_id, tenant_id, fenced)
        return _count(status) == 1

    # ------------------------------------------------------------ runs
    async def supersede_runs(self, job_id: str, tenant_id: str, up_to_attempt: int) -> int:
        """The job's own runs of attempts up to this one that have not published: they never will."""
        runs = [job_run_id(job_id, a) for a in range(1, up_to_attempt + 1)]
        return _count(await self.conn.execute(
            "UPDATE eval_runs SET status = $3, lease_owner = NULL, lease_until = NULL, updated_at = now()"
            " WHERE run_id = ANY($1::text[]) AND tenant_id = $2 AND request IS NULL"
            " AND status IN ('pending', 'running')", runs, tenant_id, RunStatus.SUPERSEDED))

    async def supersede_job_runs(self, job_id: str, tenant_id: str) -> int:
        """The job was cancelled: every own run of it that has not published never will (any attempt)."""
        return _count(await self.conn.execute(
            "UPDATE eval_runs SET status = $3, lease_owner = NULL, lease_until = NULL, updated_at = now()"
            " WHERE job_id = $1 AND tenant_id = $2 AND request IS NULL AND status IN ('pending', 'running')",
            job_id, tenant_id, RunStatus.SUPERSEDED))

    async def request_eval_if_ready(self, job_id: str) -> bool:
        """Both the job and its final checkpoint known: add a pending evaluation (once per attempt). Cheap."""
        return _count(await self.conn.execute(
            "INSERT INTO eval_runs (run_id, job_id, tenant_id, trace_id)"
            " SELECT CASE WHEN coalesce(c.attempt, 1) <= 1 THEN j.job_id ELSE j.job_id || '~a' || c.attempt END,"
            " j.job_id, j.tenant_id, c.trace_id"
            " FROM jobs j JOIN final_checkpoints c USING (job_id) WHERE j.job_id = $1 ON CONFLICT DO NOTHING",
            job_id)) == 1

    async def add_request(self, run_id: str, tenant_id: str, request: EvalRequestedV1, trace_id: str) -> bool:
        """An `eval.requested` command as a pending run (once per run id: a redelivery adds nothing). Cheap."""
        return _count(await self.conn.execute(
            "INSERT INTO eval_runs (run_id, job_id, tenant_id, request, trace_id) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT DO NOTHING", run_id, request.job_id, tenant_id, request.model_dump(mode="json"),
            trace_id)) == 1

    async def claim_next(self, owner: str, lease_s: float) -> Claim | None:
        """A pending evaluation, or a running one whose lease expired (its worker died)."""
        row = await EVAL_RUNS.claim_next(self.conn, owner, lease_s,
                                         "run_id, job_id, tenant_id, attempts, request, trace_id")
        return None if row is None else _claim(row, owner)

    async def inputs(self, claim: Claim) -> RunInputs:
        """The job projection, its final checkpoint (job runs only) and the stages the run recorded."""
        job = await self.conn.fetchrow("SELECT job_id, tenant_id, spec, tier, suffix FROM jobs"
                                       " WHERE job_id = $1 AND tenant_id = $2", claim.job_id, claim.tenant_id)
        ckpt = None
        if claim.request is None:
            ckpt = await self.conn.fetchrow("SELECT job_id, tenant_id, uri, manifest_sha256, trace_id, attempt"
                                            " FROM final_checkpoints WHERE job_id = $1", claim.job_id)
        done = await self.conn.fetchval("SELECT coalesce(jsonb_agg(result), '[]') FROM eval_stage_results"
                                        " WHERE run_id = $1", claim.run_id)
        stages = [EvalStageResult.model_validate(r, context=TOLERANT) for r in done]
        return RunInputs(job=_job(job) if job else None, checkpoint=FinalCheckpoint(**dict(ckpt)) if ckpt else None,
                         done={s.name: s for s in stages})

    async def last_accepted(self, lineage_key: str, job_id: str) -> AcceptedAdapter | None:
        row = await self.conn.fetchrow(
            "SELECT job_id, adapter_uri, adapter_manifest_sha256 FROM results WHERE lineage_key = $1"
            " AND verdict = 'passed' AND job_id <> $2 AND adapter_uri IS NOT NULL ORDER BY created_at DESC LIMIT 1",
            lineage_key, job_id)
        return AcceptedAdapter(**dict(row)) if row else None

    async def _hold_lease(self, claim: Claim) -> None:
        owner = await self.conn.fetchval("SELECT lease_owner FROM eval_runs WHERE run_id = $1 AND status = 'running'"
                                         " FOR UPDATE", claim.run_id)
        if owner != claim.owner:
            raise LeaseLost(f"evaluation {claim.run_id} is now owned by {owner}")

    async def record_stage(self, claim: Claim, result: EvalStageResult) -> None:
        """Only while the claim still holds the lease (call it inside a transaction)."""
        await self._hold_lease(claim)
        await self.conn.execute(
            "INSERT INTO eval_stage_results (run_id, stage, result) VALUES ($1, $2, $3)"
            " ON CONFLICT (run_id, stage) DO UPDATE SET result = EXCLUDED.result, recorded_at = now()",
            claim.run_id, result.name, result.model_dump(mode="json"))

    async def record_failure(self, claim: Claim, error: str) -> None:
        """A crashed attempt: back to pending. Any worker retries it; once the attempts are spent the next
        claim publishes a failed verdict instead."""
        await self.conn.execute("UPDATE eval_runs SET status = 'pending', lease_owner = NULL, last_error = $3,"
                                " transient_since = NULL, transient_retries = 0, updated_at = now()"
                                " WHERE run_id = $1 AND lease_owner = $2", claim.run_id, claim.owner, error[:2000])

    async def record_transient_failure(self, claim: Claim, error: str, *, backoff_s: float, backoff_max_s: float,
                                       budget_s: float) -> float | None:
        """An attempt that failed on an unreachable dependency: back to pending, claimable again only after
        a capped exponential pause, and the attempt is given back (not a crash) while the outage is younger
        than `budget_s`; after that it counts like a crash. The pause in seconds, or None once the budget
        is spent."""
        row = await self.conn.fetchrow(
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
        pause, within = row.values()
        return float(pause) if within else None

    async def finish(self, claim: Claim, event: EvalCompletedV1, *, lineage_key: str,
                     adapter_manifest_sha256: str) -> bool:
        """Inside the final short transaction (with the outbox publish): result row, run done. A run whose
        checkpoint is no longer the job's (its attempt was fenced or superseded meanwhile) ends
        'superseded' and publishes nothing."""
        await self._hold_lease(claim)
        current = await self.conn.fetchval("SELECT uri FROM final_checkpoints WHERE job_id = $1 FOR SHARE",
                                           claim.job_id)
        if current != event.checkpoint_uri:
            await self.conn.execute("UPDATE eval_runs SET status = $2, lease_until = NULL, updated_at = now()"
                                    " WHERE run_id = $1", claim.run_id, RunStatus.SUPERSEDED)
            return False
        loss = next((m.candidate for m in event.metrics if m.name == "holdout_loss"), None)
        status = await self.conn.execute(
            "INSERT INTO results (job_id, tenant_id, lineage_key, verdict, candidate_loss, event, adapter_uri,"
            " adapter_manifest_sha256) VALUES ($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (job_id) DO UPDATE"
            " SET verdict = EXCLUDED.verdict, candidate_loss = EXCLUDED.candidate_loss, event = EXCLUDED.event,"
            " adapter_uri = EXCLUDED.adapter_uri, adapter_manifest_sha256 = EXCLUDED.adapter_manifest_sha256,"
            " created_at = now() WHERE results.adapter_uri IS DISTINCT FROM EXCLUDED.adapter_uri",  # a newer attempt
            claim.job_id, claim.tenant_id, lineage_key, event.verdict, loss, event.model_dump(mode="json"),
            event.checkpoint_uri, adapter_manifest_sha256)
        await self._done(claim, event.verdict)
        return _count(status) == 1

    async def finish_request(self, claim: Claim, verdict: str) -> bool:
        """Inside the final short transaction of a command's run: done (the lease check makes it once)."""
        await self._hold_lease(claim)
        await self._done(claim, verdict)
        return True

    async def _done(self, claim: Claim, verdict: str) -> None:
        await self.conn.execute("UPDATE eval_runs SET status = $3, verdict = $2, lease_until = NULL,"
                                " updated_at = now() WHERE run_id = $1", claim.run_id, verdict, RunStatus.DONE)


class PgScoreCache:
    """The ScoreCache of base-side scores in Postgres, used from the worker thread: the queries run on the
    service's event loop."""

    def __init__(self, pool: asyncpg.Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool, self.loop = pool, loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def get(self, key: str) -> JsonValue | None:
        value = self._run(self.pool.fetchval("SELECT value FROM base_scores WHERE key = $1", key))
        return json.loads(value) if isinstance(value, str) else value

    def put(self, key: str, value: JsonValue) -> None:
        self._run(self.pool.execute("INSERT INTO base_scores (key, value) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                                    key, value))
