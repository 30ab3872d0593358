"""asyncpg pool per service schema, numbered migrations, inbox and outbox tables."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

import asyncpg

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]*$")

# Tables every service gets, before its own migrations.
RUNTIME_MIGRATIONS = [
    """
    CREATE TABLE IF NOT EXISTS inbox (
        consumer     text        NOT NULL,
        message_id   text        NOT NULL,
        topic        text        NOT NULL,
        processed_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (consumer, message_id)
    );
    CREATE TABLE IF NOT EXISTS outbox (
        id          bigserial   PRIMARY KEY,
        topic       text        NOT NULL,
        key         text        NOT NULL,
        value       bytea       NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now(),
        sent_at     timestamptz
    );
    CREATE INDEX IF NOT EXISTS outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
    """,
]


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(typ, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(dsn: str, schema: str, *, min_size: int = 1, max_size: int = 5) -> asyncpg.Pool:
    """A pool whose connections see only ``schema`` (created if missing)."""
    if not _SCHEMA_RE.match(schema):
        raise ValueError(f"invalid schema name {schema!r}")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    finally:
        await conn.close()
    return await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_connection,
        server_settings={"search_path": schema, "application_name": f"whetstone-{schema}"},
    )


async def migrate(pool: asyncpg.Pool, schema: str, migrations: Sequence[str]) -> int:
    """Apply numbered migrations once, under an advisory lock so replicas can start together.
    A migration whose text changed after it was applied is an error, not a silent skip."""
    steps = list(RUNTIME_MIGRATIONS) + [f"-- service\n{m}" for m in migrations]
    applied = 0
    async with pool.acquire() as conn, conn.transaction():
        lock = int(hashlib.sha256(schema.encode()).hexdigest()[:15], 16)
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version int PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"]: r["checksum"] for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")}
        for version, sql in enumerate(steps, start=1):
            checksum = hashlib.sha256(sql.encode()).hexdigest()
            if version in done:
                if done[version] != checksum:
                    raise RuntimeError(f"migration {version} of schema {schema} changed after it was applied")
                continue
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version, checksum) VALUES ($1, $2)", version, checksum)
            applied += 1
    return applied


async def claim_inbox(conn: asyncpg.Connection, consumer: str, message_id: str, topic: str) -> bool:
    """True the first time this consumer sees the message (inside the caller's transaction)."""
    row = await conn.fetchval(
        "INSERT INTO inbox (consumer, message_id, topic) VALUES ($1, $2, $3) "
        "ON CONFLICT DO NOTHING RETURNING 1",
        consumer, message_id, topic,
    )
    return row is not None


async def seen_in_inbox(pool_or_conn: Any, consumer: str, message_id: str) -> bool:
    return bool(await pool_or_conn.fetchval(
        "SELECT 1 FROM inbox WHERE consumer = $1 AND message_id = $2", consumer, message_id))
