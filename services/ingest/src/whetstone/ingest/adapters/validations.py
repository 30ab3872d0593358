"""The validation queue (table `validations`): a `dataset.submitted` event is queued in its handler's
transaction; a worker claims it under a lease, validates with no transaction open, and records the
verdict with its `dataset.validated` event in one short transaction, only while it still holds the
lease. Attempts are counted when claimed, so an upload that kills the process is not retried forever."""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from whetstone.contracts import DatasetSubmittedV1, DatasetValidatedV1
from whetstone.runtime.leases import LeasedTable
from whetstone.runtime.observability import Probe

VALIDATIONS = LeasedTable("validations", "submission_id")
# the queue behind the consumer (its lag is gone as soon as an upload is queued): KEDA scales ingest on it
PROBES = (Probe("whetstone_validations_open", "Uploads queued or being validated, by status", ("status",),
                "SELECT status, count(*)::float8 FROM validations WHERE status <> 'done' GROUP BY status"),)


@dataclass(frozen=True)
class Validation:
    submission_id: str
    tenant_id: str
    submitted: DatasetSubmittedV1
    trace_id: str
    attempts: int
    owner: str
    last_error: str | None


async def enqueue(conn: asyncpg.Connection, submission_id: str, tenant_id: str, ev: DatasetSubmittedV1,
                  trace_id: str) -> bool:
    status = await conn.execute(
        "INSERT INTO validations (submission_id, tenant_id, dataset_id, submitted, trace_id)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        submission_id, tenant_id, ev.dataset_id, ev.model_dump(mode="json"), trace_id)
    return status.endswith(" 1")


async def claim_next(pool: asyncpg.Pool, owner: str, lease_s: float) -> Validation | None:
    row = await VALIDATIONS.claim_next(pool, owner, lease_s,
                                       "submission_id, tenant_id, submitted, trace_id, attempts, last_error")
    if row is None:
        return None
    fields = dict(row)
    submitted = DatasetSubmittedV1.model_validate(fields.pop("submitted"))
    return Validation(submitted=submitted, owner=owner, **fields)


async def release(pool: asyncpg.Pool, v: Validation, error: str, *, transient: bool, backoff_s: float,
                  backoff_max_s: float, transient_budget_s: float) -> None:
    """Back to pending after a failed attempt, claimable again after a capped exponential pause. An attempt
    that failed on an unreachable dependency says nothing about the upload: it is given back while the
    outage is younger than `transient_budget_s`, and counts like a crash after that."""
    await pool.execute(
        "UPDATE validations SET status = 'pending', lease_owner = NULL, last_error = $3, updated_at = now(),"
        " retries = retries + 1, not_before = now() + make_interval(secs => least($5, $4 * power(2, retries))),"
        " transient_since = CASE WHEN $6 THEN coalesce(transient_since, now()) END,"
        " attempts = attempts - CASE WHEN $6 AND now() - coalesce(transient_since, now())"
        "                            < make_interval(secs => $7) THEN 1 ELSE 0 END"
        " WHERE submission_id = $1 AND lease_owner = $2 AND status = 'running'",
        v.submission_id, v.owner, error[:2000], backoff_s, backoff_max_s, transient, transient_budget_s)


async def finish(conn: asyncpg.Connection, v: Validation) -> bool:
    """Inside the recording transaction: the validation is done, if this worker still holds it."""
    row = await conn.fetchrow(
        "UPDATE validations SET status = 'done', lease_owner = NULL, updated_at = now()"
        " WHERE submission_id = $1 AND lease_owner = $2 AND status = 'running' RETURNING 1", v.submission_id, v.owner)
    return row is not None


async def forget_done(pool: asyncpg.Pool, older_than_days: float) -> int:
    """Retention: finished validations are kept as long as the inbox remembers their submissions."""
    status = await pool.execute("DELETE FROM validations WHERE status = 'done'"
                                " AND updated_at < now() - make_interval(secs => $1)", older_than_days * 86400)
    return int(status.split()[-1])


async def known_verdict(conn: asyncpg.Connection, tenant_id: str,
                        ev: DatasetSubmittedV1) -> tuple[DatasetValidatedV1, bool] | None:
    """The verdict already given for this dataset id (its content is immutable), unless it was given for
    another base model than the one asked for now. An upload of the Files API without one takes the
    acceptance of an earlier upload of the same bytes for the same purpose and base model (the same
    content is validated and stored once), answered under its own id and name. With the verdict: whether
    it is recorded under this id already."""
    row = await conn.fetchrow(
        "SELECT validated, base_model FROM dataset_versions WHERE tenant_id = $1 AND dataset_id = $2",
        tenant_id, ev.dataset_id)
    if row is not None:
        validated, base_model = row
        if base_model == ev.base_model or not ev.base_model:
            return DatasetValidatedV1.model_validate(validated), True
    same = await conn.fetchval(
        "SELECT dv.validated FROM files f JOIN dataset_versions dv ON dv.tenant_id = f.tenant_id"
        " AND dv.version = f.sha256 AND dv.dataset_id <> f.file_id"
        " WHERE f.tenant_id = $1 AND f.file_id = $2 AND dv.status = 'accepted'"
        " AND dv.validated->>'purpose' = $3 AND dv.base_model IS NOT DISTINCT FROM $4"
        " ORDER BY dv.created_at LIMIT 1", tenant_id, ev.dataset_id, ev.purpose, ev.base_model)
    if same is None:
        return None
    return DatasetValidatedV1.model_validate(same).model_copy(
        update={"dataset_id": ev.dataset_id, "name": ev.name}), False


async def remember_verdict(conn: asyncpg.Connection, tenant_id: str, ev: DatasetSubmittedV1,
                           event: DatasetValidatedV1) -> None:
    if not event.version:  # only content-addressed verdicts are remembered
        return
    await conn.execute(
        "INSERT INTO dataset_versions (tenant_id, dataset_id, version, name, status, report_uri, validated,"
        " base_model) VALUES ($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT (tenant_id, dataset_id) DO UPDATE SET"
        " status = EXCLUDED.status, report_uri = EXCLUDED.report_uri, validated = EXCLUDED.validated,"
        " base_model = EXCLUDED.base_model",
        tenant_id, ev.dataset_id, event.version, ev.name, event.status, event.report_uri,
        event.model_dump(mode="json"), ev.base_model)
