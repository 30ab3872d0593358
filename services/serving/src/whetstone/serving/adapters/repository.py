"""The serving projection in Postgres (schema `serving`): model versions seen on model.registered /
model.promoted, and A/B routes. Never the registry's tables."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
from pydantic import BaseModel, TypeAdapter

from ..domain.catalog import ModelVersion, StoredCheckpoint
from ..domain.routing import Route, make_route

_COLUMNS = ("model_id, tenant_id, name, stage, artifact_uri, artifact_sha256, files, base_model, base_model_sha256,"
            " chat_template_sha256, sequence, fine_tuned_model, job_id")
CHANNEL = "serving_projection"  # NOTIFY on it is delivered to every replica when the transaction commits


class _StoredVariant(BaseModel):
    """One variant of a route as the `routes.variants` column keeps it."""

    model: str
    weight: float


_VARIANTS = TypeAdapter(list[_StoredVariant])


def _change(row: asyncpg.Record) -> tuple[int, ModelVersion]:
    fields = dict(row)
    return fields.pop("change_seq"), ModelVersion(**fields)


def _route_change(row: asyncpg.Record) -> tuple[int, str, str, Route | None]:
    """(change_seq, tenant, name, the route or None once deleted)."""
    change_seq, tenant_id, name, raw = row
    variants = _VARIANTS.validate_python(raw)
    return change_seq, tenant_id, name, make_route(name, [(v.model, v.weight) for v in variants]) if variants else None


class AsyncpgServingRepository:
    """Reads take the pool; writes run on the handler's transaction (`conn`)."""

    def __init__(self) -> None:
        self._pool: asyncpg.Pool | None = None

    def bind(self, pool: asyncpg.Pool) -> None:
        """The runtime's pool exists once the service started (see bootstrap.on_start)."""
        self._pool = pool

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("repository used before the service started")
        return self._pool

    # -- change notifications ------------------------------------------------------
    @staticmethod
    async def notify_changed(conn: asyncpg.Connection) -> None:
        """Wake every replica's follower once this transaction commits (never before)."""
        await conn.execute(f"NOTIFY {CHANNEL}")

    @contextlib.asynccontextmanager
    async def changes_notified(self, wake: Callable[[], None]) -> AsyncIterator[None]:
        """Call `wake()` whenever a transaction that changed the projection commits."""
        def notified(*_: Any) -> None:
            wake()

        async with self.pool.acquire() as conn:
            await conn.add_listener(CHANNEL, notified)
            try:
                yield
            finally:
                await conn.remove_listener(CHANNEL, notified)

    # -- projection writes (inside the handler's unit of work) -----------------------
    @staticmethod
    async def owner(conn: asyncpg.Connection, model_id: str) -> str | None:
        """The tenant a model belongs to, as first seen (inside the handler's transaction)."""
        return await conn.fetchval("SELECT tenant_id FROM model_versions WHERE model_id = $1", model_id)

    @staticmethod
    async def record_registered(conn: asyncpg.Connection, v: ModelVersion) -> None:
        """Artifact facts always; the stage only while no promotion has been applied yet."""
        await conn.execute(
            f"INSERT INTO model_versions ({_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,0,$11,$12)"
            " ON CONFLICT (model_id) DO UPDATE SET name = EXCLUDED.name,"
            " stage = CASE WHEN model_versions.sequence > 0 THEN model_versions.stage ELSE EXCLUDED.stage END,"
            " artifact_uri = EXCLUDED.artifact_uri, artifact_sha256 = EXCLUDED.artifact_sha256,"
            " files = CASE WHEN EXCLUDED.files = '{}'::jsonb THEN model_versions.files ELSE EXCLUDED.files END,"
            " base_model = EXCLUDED.base_model, base_model_sha256 = EXCLUDED.base_model_sha256,"
            " chat_template_sha256 = COALESCE(EXCLUDED.chat_template_sha256, model_versions.chat_template_sha256),"
            " fine_tuned_model = COALESCE(EXCLUDED.fine_tuned_model, model_versions.fine_tuned_model),"
            " job_id = COALESCE(EXCLUDED.job_id, model_versions.job_id),"
            " change_seq = nextval('projection_changes'), updated_at = now()",
            v.model_id, v.tenant_id, v.name, v.stage, v.artifact_uri, v.artifact_sha256, v.files, v.base_model,
            v.base_model_sha256, v.chat_template_sha256, v.fine_tuned_model, v.job_id)

    @staticmethod
    async def record_promoted(conn: asyncpg.Connection, v: ModelVersion, sequence: int | None) -> bool:
        """Apply a stage change unless a newer one was applied already; True when applied."""
        applied = await conn.fetchval(
            f"INSERT INTO model_versions ({_COLUMNS})"
            " VALUES ($1,$2,COALESCE(NULLIF($3,''),$1),$4,$5,$6,$7,$8,$9,$10,$11,$13,$14)"
            " ON CONFLICT (model_id) DO UPDATE SET stage = EXCLUDED.stage,"
            " name = CASE WHEN EXCLUDED.name = '' THEN model_versions.name ELSE EXCLUDED.name END,"
            " artifact_uri = COALESCE(EXCLUDED.artifact_uri, model_versions.artifact_uri),"
            " artifact_sha256 = COALESCE(EXCLUDED.artifact_sha256, model_versions.artifact_sha256),"
            " files = CASE WHEN EXCLUDED.files = '{}'::jsonb THEN model_versions.files ELSE EXCLUDED.files END,"
            " base_model = COALESCE(EXCLUDED.base_model, model_versions.base_model),"
            " base_model_sha256 = COALESCE(EXCLUDED.base_model_sha256, model_versions.base_model_sha256),"
            " chat_template_sha256 = COALESCE(EXCLUDED.chat_template_sha256, model_versions.chat_template_sha256),"
            " sequence = GREATEST(EXCLUDED.sequence, model_versions.sequence),"
            " fine_tuned_model = COALESCE(EXCLUDED.fine_tuned_model, model_versions.fine_tuned_model),"
            " job_id = COALESCE(EXCLUDED.job_id, model_versions.job_id),"
            " change_seq = nextval('projection_changes'), updated_at = now()"
            " WHERE $12::bigint IS NULL OR $12::bigint > model_versions.sequence"
            " RETURNING 1",
            v.model_id, v.tenant_id, v.name, v.stage, v.artifact_uri, v.artifact_sha256, v.files, v.base_model,
            v.base_model_sha256, v.chat_template_sha256, sequence or 0, sequence, v.fine_tuned_model, v.job_id)
        return bool(applied)

    @staticmethod
    async def record_checkpoint(conn: asyncpg.Connection, tenant_id: str, job_id: str, step: int, uri: str,
                                manifest_sha256: str, attempt: int | None) -> None:
        """A durable checkpoint; at one step a later attempt's replaces an earlier attempt's."""
        await conn.execute(
            "INSERT INTO checkpoints (tenant_id, job_id, step, uri, manifest_sha256, attempt) VALUES ($1,$2,$3,$4,$5,$6)"
            " ON CONFLICT (tenant_id, job_id, step) DO UPDATE SET uri = EXCLUDED.uri,"
            " manifest_sha256 = EXCLUDED.manifest_sha256, attempt = EXCLUDED.attempt"
            " WHERE checkpoints.attempt <= EXCLUDED.attempt", tenant_id, job_id, step, uri, manifest_sha256, attempt or 1)

    # -- reads ---------------------------------------------------------------------
    async def changes_since(self, change_seq: int, limit: int) -> list[tuple[int, ModelVersion]]:
        rows = await self.pool.fetch(f"SELECT change_seq, {_COLUMNS} FROM model_versions WHERE change_seq > $1"
                                     " ORDER BY change_seq LIMIT $2", change_seq, limit)
        return [_change(r) for r in rows]

    async def checkpoint(self, tenant_id: str, job_id: str, step: int) -> StoredCheckpoint | None:
        """The tenant's job's checkpoint at `step`."""
        row = await self.pool.fetchrow("SELECT uri, manifest_sha256 FROM checkpoints WHERE tenant_id = $1"
                                       " AND job_id = $2 AND step = $3", tenant_id, job_id, step)
        return StoredCheckpoint(**dict(row)) if row else None

    # -- routes --------------------------------------------------------------------
    async def route_changes_since(self, change_seq: int) -> list[tuple[int, str, str, Route | None]]:
        """(change_seq, tenant, name, route or None when deleted), oldest first."""
        rows = await self.pool.fetch("SELECT change_seq, tenant_id, name, variants FROM routes WHERE change_seq > $1"
                                     " ORDER BY change_seq", change_seq)
        return [_route_change(r) for r in rows]

    async def put_route(self, tenant_id: str, route: Route, updated_by: str) -> None:
        variants = _VARIANTS.dump_python([_StoredVariant(model=v.model_id, weight=v.weight) for v in route.variants])
        await self.pool.execute("INSERT INTO routes (tenant_id, name, variants, updated_by) VALUES ($1,$2,$3,$4)"
                                " ON CONFLICT (tenant_id, name) DO UPDATE SET variants = EXCLUDED.variants,"
                                " updated_by = EXCLUDED.updated_by, updated_at = now(),"
                                " change_seq = nextval('projection_changes')",
                                tenant_id, route.name, variants, updated_by)
        await self.pool.execute(f"NOTIFY {CHANNEL}")

    async def delete_route(self, tenant_id: str, name: str, updated_by: str) -> bool:
        deleted = await self.pool.fetchval(
            "UPDATE routes SET variants = '[]'::jsonb, updated_by = $3, updated_at = now(),"
            " change_seq = nextval('projection_changes') WHERE tenant_id = $1 AND name = $2"
            " AND variants <> '[]'::jsonb RETURNING 1", tenant_id, name, updated_by) is not None
        if deleted:
            await self.pool.execute(f"NOTIFY {CHANNEL}")
        return deleted
