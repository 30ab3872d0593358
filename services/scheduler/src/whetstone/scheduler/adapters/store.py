"""Postgres side of the scheduler: the only module with SQL. Jobs load into the `Job` aggregate
and save back whole (one UPDATE), with the timeline lines the domain noted; datasets, nodes,
usage and the scheduling snapshot are read and written here too. One store per unit of work."""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

import asyncpg
from pydantic import TypeAdapter

from whetstone.contracts import TOLERANT, Event
from whetstone.contracts.events import DatasetValidatedV1
from whetstone.runtime.messaging import UnitOfWork

from ..domain import jobs as rules
from ..domain.admission import JobUsage, Usage
from ..domain.cluster import ActiveJob, ClusterView, PoolNode, WaitingJob, to_view
from ..domain.files import DatasetRecord
from ..domain.job import Job, Note
from ..domain.job_data import CheckpointEntry, TimelineEntry
from .event_wakes import EVENTS_CHANNEL

WAKE_CHANNEL = "whetstone_scheduler_wake"
ACTIVE = sorted(rules.ACTIVE_ON_NODE)
TERMINAL = sorted(rules.TERMINAL)

JOB_FIELDS = tuple(f.name for f in dataclasses.fields(Job) if f.name != "notes")
MUTABLE = tuple(f for f in JOB_FIELDS if f not in ("job_id", "tenant_id", "idempotency_key", "fingerprint",
                                                   "request", "created_at", "tier", "priority", "trace_id",
                                                   "base_model", "base_model_sha256"))
# the Job fields held in jsonb columns (and the status), mapped by the field's own type
_TYPES = typing.get_type_hints(Job)
_TYPED = {name: TypeAdapter(_TYPES[name]) for name in (
    "request", "status", "spec", "resources", "placement", "latest_checkpoint", "progress", "error", "eval",
    "early_eval", "quota")}
_ACTIVE = TypeAdapter(ActiveJob)
_WAITING = TypeAdapter(WaitingJob)
_SELECT = f"SELECT {', '.join(JOB_FIELDS)} FROM jobs"
_INSERT = (f"INSERT INTO jobs ({', '.join(JOB_FIELDS)}) VALUES "
           f"({', '.join(f'${i}' for i in range(1, len(JOB_FIELDS) + 1))})")
_UPDATE = (f"UPDATE jobs SET {', '.join(f'{c} = ${i}' for i, c in enumerate(MUTABLE, start=2))} "
           "WHERE job_id = $1")


# a tenant's GPU-seconds this month and jobs in flight ($1 tenant, $2 month); the in-flight
# predicate is the jobs_in_flight index's, spelled out
_USAGE = ("coalesce((SELECT gpu_seconds FROM tenant_usage WHERE tenant_id = $1 AND month = $2), 0) / 3600.0"
          " AS usage_gpu_hours, (SELECT count(*) FROM jobs WHERE tenant_id = $1"
          " AND status NOT IN ('succeeded', 'failed', 'cancelled')) AS usage_in_flight")


def _decode(name: str, value: Any) -> Any:
    typed = _TYPED.get(name)
    return value if typed is None or value is None else typed.validate_python(value, context=TOLERANT)


def _encode(name: str, value: Any) -> Any:
    typed = _TYPED.get(name)
    return value if typed is None or value is None else typed.dump_python(value, mode="json", exclude_none=True)


def _job(row: asyncpg.Record) -> Job:
    return Job(**{name: _decode(name, row[name]) for name in JOB_FIELDS})


_DATASET = TypeAdapter(DatasetRecord)
_DATASET_COLUMNS = ("dataset_id, version, status, purpose, data_schema, train_uri, validation_uri,"
                    " coalesce(rows_kept, 0) AS rows_kept, tokens_total, coalesce(errors, '[]') AS errors,"
                    " cost_estimate, image_rows")


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    node_id: str
    gpu_type: str
    gpu_count: int
    gpu_memory_gb: float
    spot: bool
    interconnect_group: str
    seen_at: datetime
    address: str | None = None
    schedulable: bool = True
    unschedulable_reason: str | None = None
    free_gpu_ids: list[int] | None = None   # what the node's heartbeat reports free (None: not reported)
    draining: bool = False


class JobStore:
    def __init__(self, uow: UnitOfWork, *, notify: bool = True) -> None:
        """``notify=False``: the caller wakes its own process's loop after the commit (`woke`)."""
        self.uow, self.conn = uow, uow.conn
        self.notify, self.woke = notify, False

    async def publish(self, job: Job, events: Sequence[Event]) -> None:
        """Into the outbox, in this transaction: every event about a job carries its tenant and trace."""
        for event in events:
            await self.uow.publish(event, tenant_id=job.tenant_id, trace_id=job.trace_id)

    # ----------------------------------------------------------------- jobs

    async def get(self, job_id: str, *, lock: bool = False, skip_locked: bool = False) -> Job | None:
        suffix = " FOR UPDATE SKIP LOCKED" if skip_locked else " FOR UPDATE" if lock else ""
        row = await self.conn.fetchrow(f"{_SELECT} WHERE job_id = $1{suffix}", job_id)
        return _job(row) if row else None

    async def add(self, job: Job) -> None:
        await self.conn.execute(_INSERT, *(_encode(f, getattr(job, f)) for f in JOB_FIELDS))
        await self._write_notes(job)

    async def save(self, job: Job) -> None:
        await self.conn.execute(_UPDATE, job.job_id, *(_encode(f, getattr(job, f)) for f in MUTABLE))
        await self._write_notes(job)

    async def _write_notes(self, job: Job) -> None:
        if job.notes:
            await self.conn.executemany(
                "INSERT INTO job_events (job_id, created_at, level, message, data, type) VALUES ($1,$2,$3,$4,$5,$6)",
                [(job.job_id, n.created_at, n.level, n.message, n.data, n.type) for n in job.notes])
            job.notes.clear()
            await self.events_changed(job.job_id)
        elif job.terminal:
            await self.events_changed(job.job_id)   # its streams end: wake them to say [DONE]

    async def note(self, job_id: str, note: Note) -> None:
        await self.conn.execute(
            "INSERT INTO job_events (job_id, created_at, level, message, data, type) VALUES ($1,$2,$3,$4,$5,$6)",
            job_id, note.created_at, note.level, note.message, note.data, note.type)
        await self.events_changed(job_id)

    async def events_changed(self, job_id: str) -> None:
        """Wake the job's event streams (`EventWakes`) when this transaction commits."""
        await self.conn.execute("SELECT pg_notify($1, $2)", EVENTS_CHANNEL, job_id)

    async def owner_of(self, job_id: str) -> str | None:
        return await self.conn.fetchval("SELECT tenant_id FROM jobs WHERE job_id = $1", job_id)

    async def queue_position(self, sort_key: float | None, job_id: str) -> int:
        """1 + queued jobs ahead of this sort key (the job itself not counted, queued or not)."""
        return 1 + await self.conn.fetchval(
            "SELECT count(*) FROM jobs WHERE status = 'queued' AND (sort_key, job_id) < ($1, $2)", sort_key, job_id)

    async def lock_tenant(self, tenant_id: str) -> None:
        """Serialise one tenant's admissions: the in-flight count and usage read stay true until commit."""
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('tenant:' || $1, 0))", tenant_id)

    async def usage(self, tenant_id: str, month: str) -> Usage:
        hours, in_flight = await self.conn.fetchrow(f"SELECT {_USAGE}", tenant_id, month)
        return Usage(hours, in_flight)

    async def peek(self, job_id: str, tenant_id: str, month: str) -> tuple[Job | None, Usage]:
        """The job under this id (a retry) and the tenant's usage in one round trip, without locks:
        enough to answer a retry, or to refuse a tenant already at its cap before any sizing work."""
        row = await self.conn.fetchrow(f"SELECT {_USAGE}, j.job_id IS NOT NULL AS found,"
                                       f" {', '.join('j.' + f for f in JOB_FIELDS)}"
                                       " FROM (SELECT 1) one LEFT JOIN jobs j ON j.job_id = $3",
                                       tenant_id, month, job_id)
        hours, in_flight, found = row[0], row[1], row[2]
        return (_job(row) if found else None), Usage(hours, in_flight)

    async def waiting_for(self, tenant_id: str, dataset_id: str) -> list[Job]:
        """The tenant's jobs waiting for this dataset's verdict (as their training or validation file)."""
        rows = await self.conn.fetch(
            f"{_SELECT} WHERE tenant_id = $1 AND status = $2"
            " AND (request->>'training_file' = $3 OR request->>'validation_file' = $3)"
            " ORDER BY created_at FOR UPDATE", tenant_id, rules.VALIDATING, dataset_id)
        return [_job(r) for r in rows]

    async def jobs_on_node(self, node_id: str) -> list[Job]:
        rows = await self.conn.fetch(f"{_SELECT} WHERE $1 = ANY(node_ids) AND status = ANY($2::text[]) FOR UPDATE",
                                     node_id, ACTIVE)
        return [_job(r) for r in rows]

    async def waiting_since(self, cutoff: datetime) -> list[tuple[Job, bool]]:
        """Jobs still in validating_files created before the cutoff, and whether their dataset was submitted."""
        rows = await self.conn.fetch(
            f"SELECT j.job_id, EXISTS (SELECT 1 FROM dataset_submissions s WHERE s.tenant_id = j.tenant_id"
            f"  AND s.dataset_id = j.request->>'training_file') AS submitted FROM ({_SELECT}) j"
            " WHERE j.status = $1 AND j.created_at < $2", rules.VALIDATING, cutoff)
        locked = []
        for job_id, submitted in rows:
            job = await self.get(job_id, skip_locked=True)
            if job is not None and job.status == rules.VALIDATING:
                locked.append((job, bool(submitted)))
        return locked

    async def queued_since(self, cutoff: datetime) -> list[Job]:
        rows = await self.conn.fetch(f"{_SELECT} WHERE status = 'queued' AND queued_at < $1 FOR UPDATE SKIP LOCKED",
                                     cutoff)
        return [_job(r) for r in rows]

    async def quiet_since(self, cutoff: datetime) -> list[Job]:
        """Jobs on a node or evaluating with no sign of life (or a checkpoint-and-stop request
        unanswered) since the cutoff: candidates for a state timeout (the domain decides)."""
        rows = await self.conn.fetch(
            f"{_SELECT} WHERE status = ANY($1::text[]) AND least(coalesce(last_activity_at, updated_at),"
            " coalesce(preempt_requested_at, updated_at)) < $2 FOR UPDATE SKIP LOCKED",
            [*ACTIVE, rules.EVALUATING], cutoff)
        return [_job(r) for r in rows]

    # ---------------------------------------------------------- API reads

    async def page(self, tenant_id: str, after: str | None, limit: int) -> tuple[list[Job], bool]:
        cursor = await self.conn.fetchrow("SELECT created_at, job_id FROM jobs WHERE job_id = $1 AND tenant_id = $2",
                                          after, tenant_id) if after else None
        rows = await self.conn.fetch(
            f"{_SELECT} WHERE tenant_id = $1 AND ($2::timestamptz IS NULL OR (created_at, job_id) < ($2, $3))"
            " ORDER BY created_at DESC, job_id DESC LIMIT $4",
            tenant_id, *(cursor if cursor else (None, "")), limit + 1)
        return [_job(r) for r in rows[:limit]], len(rows) > limit

    async def events(self, job_id: str, after: int | None, limit: int,
                     newest_first: bool = True) -> list[TimelineEntry]:
        if newest_first:
            rows = await self.conn.fetch(
                "SELECT * FROM job_events WHERE job_id = $1 AND ($2::bigint IS NULL OR id < $2)"
                " ORDER BY id DESC LIMIT $3", job_id, after, limit)
        else:
            rows = await self.conn.fetch("SELECT * FROM job_events WHERE job_id = $1 AND id > $2 ORDER BY id LIMIT $3",
                                         job_id, after or 0, limit)
        return [TimelineEntry(**r) for r in rows]

    async def add_checkpoint(self, job_id: str, checkpoint_id: str, step: int, kind: str, uri: str,
                             created_at: datetime, metrics: dict[str, float]) -> None:
        await self.conn.execute(
            "INSERT INTO job_checkpoints (job_id, checkpoint_id, step, kind, uri, created_at, metrics)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7) ON CONFLICT (job_id, checkpoint_id) DO NOTHING",
            job_id, checkpoint_id, step, kind, uri, created_at, metrics)

    async def checkpoints(self, job_id: str, after: str | None, limit: int) -> tuple[list[CheckpointEntry], bool]:
        rows = await self.conn.fetch(
            "SELECT * FROM job_checkpoints WHERE job_id = $1 AND ($2::text IS NULL OR (step, checkpoint_id) <"
            " (SELECT step, checkpoint_id FROM job_checkpoints WHERE job_id = $1 AND checkpoint_id = $2))"
            " ORDER BY step DESC, checkpoint_id DESC LIMIT $3", job_id, after, limit + 1)
        return [CheckpointEntry(**r) for r in rows[:limit]], len(rows) > limit

    # ------------------------------------------------------------ datasets

    async def dataset(self, tenant_id: str, dataset_id: str) -> DatasetRecord | None:
        """The dataset's verdict, None until `dataset.validated` is heard."""
        row = await self.conn.fetchrow(f"SELECT {_DATASET_COLUMNS} FROM datasets WHERE tenant_id = $1"
                                       " AND dataset_id = $2", tenant_id, dataset_id)
        return None if row is None else _DATASET.validate_python(dict(row), context=TOLERANT)

    async def file_seen(self, tenant_id: str, dataset_id: str) -> tuple[bool, bool]:
        """(whether the file was submitted, whether it was deleted)."""
        row = await self.conn.fetchrow(
            "SELECT EXISTS (SELECT 1 FROM dataset_submissions WHERE tenant_id = $1 AND dataset_id = $2),"
            " EXISTS (SELECT 1 FROM dataset_deletions WHERE tenant_id = $1 AND dataset_id = $2)", tenant_id, dataset_id)
        return bool(row[0]), bool(row[1])

    async def dataset_known(self, tenant_id: str, dataset_id: str) -> bool:
        """Whether the tenant submitted the file or its verdict is known."""
        return bool(await self.conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM datasets WHERE tenant_id = $1 AND dataset_id = $2)"
            " OR EXISTS (SELECT 1 FROM dataset_submissions WHERE tenant_id = $1 AND dataset_id = $2)",
            tenant_id, dataset_id))

    async def dataset_deleted(self, tenant_id: str, dataset_id: str, at: datetime) -> None:
        await self.conn.execute("INSERT INTO dataset_deletions (tenant_id, dataset_id, deleted_at) VALUES ($1, $2, $3)"
                                " ON CONFLICT DO NOTHING", tenant_id, dataset_id, at)

    async def jobs_on_file(self, tenant_id: str, dataset_id: str, statuses: Sequence[str]) -> list[str]:
        """The ids of the tenant's jobs training on the file in one of these statuses, oldest first."""
        rows = await self.conn.fetch(
            "SELECT job_id FROM jobs WHERE tenant_id = $1 AND request->>'training_file' = $2"
            " AND status = ANY($3::text[]) ORDER BY created_at", tenant_id, dataset_id, list(statuses))
        return [r[0] for r in rows]

    async def dataset_submitted(self, tenant_id: str, dataset_id: str, at: datetime) -> None:
        await self.conn.execute("INSERT INTO dataset_submissions (tenant_id, dataset_id, submitted_at)"
                                " VALUES ($1, $2, $3) ON CONFLICT DO NOTHING", tenant_id, dataset_id, at)

    async def dataset_validated(self, tenant_id: str, ev: DatasetValidatedV1) -> None:
        await self.conn.execute(
            "INSERT INTO datasets (tenant_id, dataset_id, version, status, purpose, train_uri, validation_uri,"
            " rows_kept, tokens_total, errors, cost_estimate, data_schema, image_rows)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)"
            " ON CONFLICT (tenant_id, dataset_id) DO UPDATE SET version = EXCLUDED.version, status = EXCLUDED.status,"
            " purpose = EXCLUDED.purpose, train_uri = EXCLUDED.train_uri, validation_uri = EXCLUDED.validation_uri,"
            " rows_kept = EXCLUDED.rows_kept, tokens_total = EXCLUDED.tokens_total, errors = EXCLUDED.errors,"
            " cost_estimate = EXCLUDED.cost_estimate, data_schema = EXCLUDED.data_schema,"
            " image_rows = EXCLUDED.image_rows",
            tenant_id, ev.dataset_id, ev.version, ev.status, ev.purpose, ev.train_uri, ev.validation_uri,
            ev.rows_kept, ev.tokens_total, [e.model_dump(mode="json") for e in ev.errors],
            ev.cost_estimate.model_dump(mode="json") if ev.cost_estimate is not None else None,
            ev.data_schema, ev.stats.rows_with_images or 0)

    # --------------------------------------------------------------- nodes

    async def upsert_node(self, node: NodeFacts) -> None:
        """One node's facts from the Kubernetes inventory (schedulability from taints and cordons);
        heartbeats write theirs in `heartbeat`."""
        await self.conn.execute(
            "INSERT INTO nodes (node_id, gpu_type, gpu_count, gpu_memory_gb, spot, interconnect_group, last_seen, lost,"
            " address, schedulable, unschedulable_reason, source) VALUES ($1,$2,$3,$4,$5,$6,$7,false,$8,$9,$10,'k8s')"
            " ON CONFLICT (node_id) DO UPDATE SET gpu_type = EXCLUDED.gpu_type, gpu_count = EXCLUDED.gpu_count,"
            " gpu_memory_gb = EXCLUDED.gpu_memory_gb, spot = EXCLUDED.spot,"
            " interconnect_group = EXCLUDED.interconnect_group, schedulable = EXCLUDED.schedulable,"
            " unschedulable_reason = EXCLUDED.unschedulable_reason",
            node.node_id, node.gpu_type, node.gpu_count, node.gpu_memory_gb, node.spot, node.interconnect_group,
            node.seen_at, node.address, node.schedulable, node.unschedulable_reason)

    async def heartbeat(self, node: NodeFacts, claimed: Sequence[str], silent_before: datetime) -> tuple[list[str], bool]:
        """A node's heartbeat in one round trip: (the claimed jobs placed on other nodes, whether the
        scheduling loop should wake: a job is queued and the node adds capacity it did not have, being
        new, back from lost or from silence since `silent_before`, of another shape, done draining, or
        reporting a GPU free that its last heartbeat did not). The node is upserted as alive only when it
        claims no other node's job; its free GPU ids and draining flag only from its newest heartbeat."""
        row = await self.conn.fetchrow(
            "WITH foreign_claims AS (SELECT job_id FROM jobs WHERE job_id = ANY($9::text[])"
            " AND status = ANY($10::text[]) AND NOT ($1 = ANY(node_ids))),"
            " before AS (SELECT lost, last_seen, gpu_type, gpu_count, free_gpu_ids, draining FROM nodes"
            " WHERE node_id = $1),"
            " up AS (INSERT INTO nodes (node_id, gpu_type, gpu_count, gpu_memory_gb, spot, interconnect_group,"
            " last_seen, lost, address, schedulable, unschedulable_reason, source, free_gpu_ids, draining)"
            " SELECT $1, $2, $3, $4, $5, $6, $7, false, $8, true, NULL, 'heartbeat', $12::int[], $13"
            " WHERE NOT EXISTS (SELECT 1 FROM foreign_claims)"
            " ON CONFLICT (node_id) DO UPDATE SET gpu_type = EXCLUDED.gpu_type, gpu_count = EXCLUDED.gpu_count,"
            " gpu_memory_gb = EXCLUDED.gpu_memory_gb, spot = EXCLUDED.spot,"
            " interconnect_group = EXCLUDED.interconnect_group, address = coalesce(EXCLUDED.address, nodes.address),"
            " free_gpu_ids = CASE WHEN EXCLUDED.last_seen >= nodes.last_seen THEN EXCLUDED.free_gpu_ids"
            " ELSE nodes.free_gpu_ids END,"
            " draining = CASE WHEN EXCLUDED.last_seen >= nodes.last_seen THEN EXCLUDED.draining ELSE nodes.draining END,"
            " last_seen = greatest(nodes.last_seen, EXCLUDED.last_seen), lost = false)"
            " SELECT ARRAY(SELECT job_id FROM foreign_claims ORDER BY job_id) AS foreign_jobs,"
            " NOT EXISTS (SELECT 1 FROM before WHERE NOT lost AND last_seen >= $11 AND gpu_type = $2"
            " AND gpu_count = $3 AND (draining OR NOT $13)"
            " AND ($12::int[] IS NULL OR free_gpu_ids IS NULL OR $12::int[] <@ free_gpu_ids))"
            " AND EXISTS (SELECT 1 FROM jobs WHERE status = 'queued') AS wake",
            node.node_id, node.gpu_type, node.gpu_count, node.gpu_memory_gb, node.spot, node.interconnect_group,
            node.seen_at, node.address, list(claimed), ACTIVE, silent_before, node.free_gpu_ids, node.draining)
        foreign, wake = row
        return list(foreign), bool(wake)

    async def node_deleted(self, node_id: str) -> None:
        await self.conn.execute("UPDATE nodes SET lost = true, schedulable = false, unschedulable_reason = 'deleted'"
                                " WHERE node_id = $1", node_id)

    async def mark_lost(self, silent_since: datetime) -> list[str]:
        rows = await self.conn.fetch("UPDATE nodes SET lost = true WHERE NOT lost AND last_seen < $1 RETURNING node_id",
                                     silent_since)
        return [node_id for (node_id,) in rows]

    async def pool_nodes(self) -> list[PoolNode]:
        rows = await self.conn.fetch("SELECT node_id, gpu_type, gpu_count, gpu_memory_gb, spot, interconnect_group"
                                     " FROM nodes WHERE NOT lost")
        return [PoolNode(**r) for r in rows]

    async def addresses(self, node_ids: Sequence[str]) -> dict[str, str | None]:
        rows = await self.conn.fetch("SELECT node_id, address FROM nodes WHERE node_id = ANY($1)", list(node_ids))
        return {node_id: address for node_id, address in rows}

    # ------------------------------------------------------------- cluster

    async def lock_cycle(self, key: int) -> None:
        """One cycle at a time, across replicas too."""
        await self.conn.execute("SELECT pg_advisory_xact_lock($1)", key)

    async def cluster(self, now: datetime, node_seen_since: datetime, queue_limit: int,
                      checkpoint_s: float) -> ClusterView:
        node_rows = await self.conn.fetch(
            "SELECT node_id, gpu_type, gpu_count, gpu_memory_gb, spot, interconnect_group, free_gpu_ids, draining"
            " FROM nodes WHERE NOT lost AND schedulable AND last_seen >= $1 ORDER BY node_id", node_seen_since)
        active = await self.conn.fetch(
            "SELECT job_id, tier, placement, segment_started_at, est_end_at, last_checkpoint_at, progress,"
            " preempt_requested_at, priority_preemptions, queued_at FROM jobs WHERE status = ANY($1::text[])", ACTIVE)
        queued = await self.conn.fetch(
            "SELECT job_id, tenant_id, tier, queued_at, resources, estimated_runtime_s, progress, spot_preemptions,"
            " queued_since, waited_s"
            " FROM jobs WHERE status = 'queued' ORDER BY sort_key, job_id LIMIT $1", queue_limit)
        return to_view(now, [PoolNode(**r) for r in node_rows],
                       [_ACTIVE.validate_python(dict(r), context=TOLERANT) for r in active],
                       [_WAITING.validate_python(dict(r), context=TOLERANT) for r in queued], checkpoint_s)

    @staticmethod
    @contextlib.asynccontextmanager
    async def wakes(pool: asyncpg.Pool, wake: Any) -> AsyncIterator[None]:
        """Call ``wake()`` whenever a transaction that ran `wake_scheduler` commits."""
        def notified(*_: Any) -> None:
            wake()

        async with pool.acquire() as conn:
            await conn.add_listener(WAKE_CHANNEL, notified)
            try:
                yield
            finally:
                with contextlib.suppress(asyncpg.InterfaceError):   # the connection went with the database
                    await conn.remove_listener(WAKE_CHANNEL, notified)

    async def wake_scheduler(self) -> None:
        """Wake the scheduling loop when this transaction commits (Postgres delivers NOTIFY on commit)."""
        self.woke = True
        if self.notify:
            await self.conn.execute(f"NOTIFY {WAKE_CHANNEL}")

    # --------------------------------------------------------------- usage

    async def first_sight_of_usage(self, job_id: str, key: str) -> bool:
        return bool(await self.conn.fetchval("INSERT INTO usage_seen (job_id, key) VALUES ($1, $2)"
                                             " ON CONFLICT DO NOTHING RETURNING true", job_id, key))

    async def job_usage(self, job_id: str, tenant_id: str) -> tuple[str, JobUsage]:
        row = await self.conn.fetchrow(
            "INSERT INTO job_usage (job_id, tenant_id) VALUES ($1, $2) ON CONFLICT (job_id)"
            " DO UPDATE SET job_id = EXCLUDED.job_id"
            " RETURNING tenant_id, segments, segment_seconds, segment_cost, total_seconds, total_cost", job_id, tenant_id)
        holder, *figures = row
        return holder, JobUsage(*figures)

    async def save_job_usage(self, job_id: str, u: JobUsage) -> None:
        await self.conn.execute(
            "UPDATE job_usage SET segments = $2, segment_seconds = $3, segment_cost = $4, total_seconds = $5,"
            " total_cost = $6 WHERE job_id = $1", job_id, u.segments, u.segment_seconds, u.segment_cost,
            u.total_seconds, u.total_cost)

    async def add_tenant_usage(self, tenant_id: str, month: str, jobs: int, seconds: float, cost: float) -> None:
        await self.conn.execute(
            "INSERT INTO tenant_usage (tenant_id, month, jobs, gpu_seconds, cost) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT (tenant_id, month) DO UPDATE SET jobs = tenant_usage.jobs + EXCLUDED.jobs,"
            " gpu_seconds = tenant_usage.gpu_seconds + EXCLUDED.gpu_seconds, cost = tenant_usage.cost + EXCLUDED.cost",
            tenant_id, month, jobs, seconds, cost)
