"""WandbRunStore (table `job_wandb_runs`): the W&B offline run each job asked for, and its life.

`waiting` (recorded from job.queued) -> `pending` (the job's results file was made) -> `running` (a worker
holds the lease, see `runtime/leases.py`) -> `done` (its result file recorded once), or `failed` after
`max_attempts` crashes, or `cancelled` (a cancelled job makes no result file). A step read after the run
was queued bumps `revision`; a worker that recorded an older revision puts the run back to `pending`."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from whetstone.runtime.leases import LeasedTable
from whetstone.runtime.observability import Probe

from ..domain.wandb_runs import WandbPlan

WANDB_RUNS = LeasedTable("job_wandb_runs", "run_key")
PROBES = (Probe("whetstone_wandb_runs_open", "W&B offline runs queued or being written, by status", ("status",),
                "SELECT status, count(*)::float8 FROM job_wandb_runs WHERE status IN ('pending', 'running')"
                " GROUP BY status"),)


@dataclass(frozen=True)
class WandbRunClaim:
    run_key: str
    tenant_id: str
    job_id: str
    plan: WandbPlan
    revision: int           # the step figures' revision this claim writes
    file_id: str | None     # the result file, once made
    attempts: int
    owner: str


def run_key(tenant_id: str, job_id: str) -> str:
    return f"{tenant_id}/{job_id}"


class WandbRunStore:
    def __init__(self, conn: asyncpg.Connection | asyncpg.Pool) -> None:
        self.conn = conn

    async def remember(self, tenant_id: str, plan: WandbPlan, results_made: bool) -> bool:
        """From job.queued (the first one: a requeued job keeps its plan). Pending at once where the results
        file was made before job.queued was read (topics are not ordered with each other)."""
        status: str = await self.conn.execute(
            "INSERT INTO job_wandb_runs (run_key, tenant_id, job_id, plan, status) VALUES ($1,$2,$3,$4,$5)"
            " ON CONFLICT DO NOTHING", run_key(tenant_id, plan.job_id), tenant_id, plan.job_id,
            plan.model_dump(mode="json"), "pending" if results_made else "waiting")
        return status.endswith(" 1") and results_made

    async def queue(self, tenant_id: str, job_id: str) -> bool:
        """The results file was made: the run is to be written (True where the job asked for one)."""
        status: str = await self.conn.execute(
            "UPDATE job_wandb_runs SET status = 'pending', updated_at = now() WHERE run_key = $1"
            " AND status = 'waiting'", run_key(tenant_id, job_id))
        return status.endswith(" 1")

    async def steps_changed(self, tenant_id: str, job_id: str) -> bool:
        """A step's figures read after the run was queued: write it again (True where it is to be)."""
        status: str = await self.conn.execute(
            "UPDATE job_wandb_runs SET revision = revision + 1, updated_at = now(),"
            " status = CASE WHEN status = 'done' AND file_id IS NOT NULL THEN 'pending' ELSE status END"
            " WHERE run_key = $1 AND status IN ('pending', 'running', 'done')", run_key(tenant_id, job_id))
        return status.endswith(" 1")

    async def cancel(self, tenant_id: str, job_id: str) -> None:
        await self.conn.execute("UPDATE job_wandb_runs SET status = 'cancelled', updated_at = now()"
                                " WHERE run_key = $1 AND status = 'waiting'", run_key(tenant_id, job_id))

    async def claim_next(self, pool: asyncpg.Pool, owner: str, lease_s: float) -> WandbRunClaim | None:
        row = await WANDB_RUNS.claim_next(pool, owner, lease_s,
                                          "run_key, tenant_id, job_id, plan, revision, file_id, attempts")
        if row is None:
            return None
        fields = dict(row)
        return WandbRunClaim(plan=WandbPlan.model_validate(fields.pop("plan")), owner=owner, **fields)

    async def finish(self, claim: WandbRunClaim, file_id: str | None) -> bool:
        """In the recording transaction: done (or pending again where steps changed since the claim), if this
        worker still holds the run. The row stays locked until the transaction ends."""
        return await self.conn.fetchval(
            "UPDATE job_wandb_runs SET file_id = coalesce(file_id, $3), lease_owner = NULL, updated_at = now(),"
            " status = CASE WHEN revision = $4 THEN 'done' ELSE 'pending' END, attempts = CASE WHEN revision = $4"
            " THEN attempts ELSE 0 END WHERE run_key = $1 AND lease_owner = $2 AND status = 'running'"
            " RETURNING 1", claim.run_key, claim.owner, file_id, claim.revision) is not None

    async def file_of(self, claim: WandbRunClaim) -> str | None:
        """The run's result file as recorded now (under a row lock: one transaction makes it)."""
        file_id: str | None = await self.conn.fetchval(
            "SELECT file_id FROM job_wandb_runs WHERE run_key = $1 FOR UPDATE", claim.run_key)
        return file_id

    async def give_up(self, claim: WandbRunClaim, error: str) -> None:
        """The run cannot be written (its plan or the SDK failed `max_attempts` times): no result file."""
        await self.conn.execute("UPDATE job_wandb_runs SET status = 'failed', lease_owner = NULL, last_error = $3,"
                                " updated_at = now() WHERE run_key = $1 AND lease_owner = $2", claim.run_key,
                                claim.owner, error[:2000])

    async def release(self, claim: WandbRunClaim, error: str, backoff_s: float) -> None:
        """Back to pending after a failed attempt, claimable again after a pause doubling with the attempts."""
        await self.conn.execute(
            "UPDATE job_wandb_runs SET status = 'pending', lease_owner = NULL, last_error = $3, updated_at = now(),"
            " not_before = now() + make_interval(secs => least(300, $4 * power(2, attempts - 1)))"
            " WHERE run_key = $1 AND lease_owner = $2 AND status = 'running'", claim.run_key, claim.owner,
            error[:2000], backoff_s)
