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

# Runtime tables added later. Numbered from RUNTIME_LATER_BASE so that the numbers of the services'
# own migrations (2, 3, ...) stay what they were in databases migrated before these existed.
RUNTIME_LATER_BASE = 10_000
RUNTIME_LATER_MIGRATIONS = [
    """
    -- an outbox row the broker refuses for itself (too large, bad topic) is quarantined, not retried forever
    ALTER TABLE outbox ADD COLUMN IF NOT EXISTS attempts int NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN IF NOT EXISTS last_error text;
    ALTER TABLE outbox ADD COLUMN IF NOT EXISTS quarantined_at timestamptz;
    DROP INDEX IF EXISTS outbox_unsent;
    CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (id) WHERE sent_at IS NULL AND quarantined_at IS NULL;
    CREATE INDEX IF NOT EXISTS outbox_sent_at ON outbox (sent_at) WHERE sent_at IS NOT NULL;
    CREATE INDEX IF NOT EXISTS inbox_processed_at ON inbox (processed_at);
    -- deliveries of one record, counted outside the handler's transaction: a record that kills
    -- the process is seen again after the restart and dead-lettered once it has been tried enough
    CREATE TABLE IF NOT EXISTS deliveries (
        consumer   text        NOT NULL,
        topic      text        NOT NULL,
        partition  int         NOT NULL,
        "offset"   bigint      NOT NULL,
        count      int         NOT NULL DEFAULT 1,
        last_at    timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (consumer, topic, partition, "offset")
    );
    """,
    """
    -- one row per event this service's consumer finished (handled or dead-lettered): the service's
    -- part of a job's trace (`GET /internal/trace`, `whet jobs trace`); written in batches, see tracing.py
    CREATE TABLE IF NOT EXISTS handled (
        consumer    text             NOT NULL,
        event_id    text             NOT NULL,
        topic       text             NOT NULL,
        event_type  text             NOT NULL,
        tenant_id   text             NOT NULL,
        trace_id    text,
        job_id      text,
        producer    text,
        produced_at timestamptz,
        started_at  timestamptz      NOT NULL,
        handler_s   double precision NOT NULL,
        outcome     text             NOT NULL
    );
    CREATE INDEX IF NOT EXISTS handled_job ON handled (job_id) WHERE job_id IS NOT NULL;
    CREATE INDEX IF NOT EXISTS handled_trace ON handled (trace_id);
    CREATE INDEX IF NOT EXISTS handled_started ON handled (started_at);
    """,
    """
    -- the tenant owning each job / model this service has seen (tenancy.py): other tenants' events are refused
    CREATE TABLE IF NOT EXISTS owners (
        kind      text NOT NULL,
        id        text NOT NULL,
        tenant_id text NOT NULL,
        PRIMARY KEY (kind, id)
    );
    """,
]


async def _init_connection(conn: asyncpg.Connection) -> None:
    for typ in ("json", "jsonb"):
        await conn.set_type_codec(typ, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class PooledConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg is untyped
    """The platform keeps no session state on pooled connections: advisory locks are
    transaction-scoped, a listener is removed (UNLISTEN) by the code that added it, nothing runs
    SET or opens a cursor outside a transaction. Releasing one therefore needs no reset query
    (`SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`): one round trip fewer
    per unit of work. asyncpg still rolls back a transaction left open and drops listeners."""

    def get_reset_query(self) -> str:
        return ""


async def create_pool(dsn: str, schema: str, *, min_size: int = 1, max_size: int = 5) -> asyncpg.Pool:
    """A pool whose connections see only ``schema`` (created if missing, under the schema's advisory
    lock: replicas starting together on a fresh database would otherwise race in CREATE SCHEMA IF NOT
    EXISTS, and the loser fails on pg_namespace's unique index)."""
    if not _SCHEMA_RE.match(schema):
        raise ValueError(f"invalid schema name {schema!r}")
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(schema))
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    finally:
        await conn.close()
    return await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_connection, connection_class=PooledConnection,
        server_settings={"search_path": schema, "application_name": f"whetstone-{schema}"},
    )


def lock_key(schema: str, purpose: str = "") -> int:
    """A Postgres advisory-lock key for one purpose in one service schema."""
    return int(hashlib.sha256(f"{schema}{':' + purpose if purpose else ''}".encode()).hexdigest()[:15], 16)


async def migrate(pool: asyncpg.Pool, schema: str, migrations: Sequence[str]) -> int:
    """Apply numbered migrations once, under an advisory lock so replicas can start together.
    A migration whose text changed after it was applied is an error, not a silent skip."""
    steps = list(enumerate(RUNTIME_MIGRATIONS, start=1))
    steps += [(len(RUNTIME_MIGRATIONS) + i, f"-- service\n{m}") for i, m in enumerate(migrations, start=1)]
    steps += [(RUNTIME_LATER_BASE + i, m) for i, m in enumerate(RUNTIME_LATER_MIGRATIONS, start=1)]
    applied = 0
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(schema))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version int PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"]: r["checksum"] for r in await conn.fetch("SELECT version, checksum FROM schema_migrations")}
        for version, sql in steps:
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


async def check_delivery(pool_or_conn: Any, consumer: str, message_id: str, topic: str, partition: int,
                         offset: int) -> tuple[bool, int]:
    """One round trip before a handler runs: was the event handled already (inbox), and if not, how
    many times has this record been delivered, this time included. The count is committed at once,
    outside any handler transaction, so a crash cannot roll it back; a duplicate counts nothing."""
    row = await pool_or_conn.fetchrow(
        "WITH seen AS (SELECT 1 FROM inbox WHERE consumer = $1 AND message_id = $2),"
        ' counted AS (INSERT INTO deliveries (consumer, topic, partition, "offset")'
        " SELECT $1, $3, $4, $5 WHERE NOT EXISTS (SELECT 1 FROM seen)"
        ' ON CONFLICT (consumer, topic, partition, "offset")'
        " DO UPDATE SET count = deliveries.count + 1, last_at = now() RETURNING count)"
        " SELECT EXISTS (SELECT 1 FROM seen) AS seen, (SELECT count FROM counted) AS deliveries",
        consumer, message_id, topic, partition, offset)
    return bool(row["seen"]), int(row["deliveries"] or 0)


async def count_delivery(pool_or_conn: Any, consumer: str, topic: str, partition: int, offset: int) -> int:
    """How many times this record has been delivered to this consumer, this time included
    (committed at once, outside any handler transaction, so a crash cannot roll it back)."""
    count: int = await pool_or_conn.fetchval(
        'INSERT INTO deliveries (consumer, topic, partition, "offset") VALUES ($1, $2, $3, $4)'
        ' ON CONFLICT (consumer, topic, partition, "offset")'
        " DO UPDATE SET count = deliveries.count + 1, last_at = now() RETURNING count",
        consumer, topic, partition, offset)
    return count


async def count_deliveries(pool_or_conn: Any, consumer: str, records: Sequence[tuple[str, int, int]]) -> int:
    """`count_delivery` for many (topic, partition, offset) at once; returns the highest count."""
    topics, partitions, offsets = (list(col) for col in zip(*records, strict=True)) if records else ([], [], [])
    return int(await pool_or_conn.fetchval(
        'WITH counted AS (INSERT INTO deliveries (consumer, topic, partition, "offset")'
        " SELECT $1, t, p, o FROM unnest($2::text[], $3::int[], $4::bigint[]) AS r(t, p, o)"
        ' ON CONFLICT (consumer, topic, partition, "offset")'
        " DO UPDATE SET count = deliveries.count + 1, last_at = now() RETURNING count)"
        " SELECT coalesce(max(count), 0) FROM counted", consumer, topics, partitions, offsets))


async def count_fetch(pool_or_conn: Any, consumer: str, counter: str, firsts: Sequence[tuple[str, int, int]],
                      message_ids: Sequence[str]) -> tuple[int, set[str]]:
    """One round trip per fetch: count this delivery of the fetch under `counter`, by the first
    (topic, partition, offset) of each partition in it (committed at once, outside any handler
    transaction, so a crash cannot roll it back); returns the highest count and which of
    `message_ids` this consumer has handled already (its inbox)."""
    topics, partitions, offsets = (list(col) for col in zip(*firsts, strict=True)) if firsts else ([], [], [])
    row = await pool_or_conn.fetchrow(
        'WITH counted AS (INSERT INTO deliveries (consumer, topic, partition, "offset")'
        " SELECT $1, t, p, o FROM unnest($2::text[], $3::int[], $4::bigint[]) AS r(t, p, o)"
        ' ON CONFLICT (consumer, topic, partition, "offset")'
        " DO UPDATE SET count = deliveries.count + 1, last_at = now() RETURNING count)"
        " SELECT (SELECT coalesce(max(count), 0) FROM counted) AS deliveries,"
        " ARRAY(SELECT message_id FROM inbox WHERE consumer = $5 AND message_id = ANY($6::text[])) AS seen",
        counter, topics, partitions, offsets, consumer, list(message_ids))
    return int(row["deliveries"]), set(row["seen"])


async def prune(pool_or_conn: Any, *, outbox_sent_hours: float, inbox_days: float, deliveries_hours: float,
                kept_like_inbox: Sequence[tuple[str, str]] = ()) -> dict[str, int]:
    """Retention: rows that can no longer matter. Inbox rows must outlive the longest possible
    redelivery (the topics' retention), or a very late duplicate would be handled again; so do the
    service's own `kept_like_inbox` tables (table, timestamp column), which guard against one too."""
    out = {}
    for table, column in kept_like_inbox:
        if not (_SCHEMA_RE.match(table) and _SCHEMA_RE.match(column)):
            raise ValueError(f"invalid table or column name {table!r}.{column!r}")
    for name, sql, age in (
        ("outbox", "DELETE FROM outbox WHERE sent_at < now() - make_interval(secs => $1)", outbox_sent_hours * 3600),
        ("inbox", "DELETE FROM inbox WHERE processed_at < now() - make_interval(secs => $1)", inbox_days * 86400),
        ("deliveries", "DELETE FROM deliveries WHERE last_at < now() - make_interval(secs => $1)",
         deliveries_hours * 3600),
        ("handled", "DELETE FROM handled WHERE started_at < now() - make_interval(secs => $1)", inbox_days * 86400),
        *((table, f"DELETE FROM {table} WHERE {column} < now() - make_interval(secs => $1)", inbox_days * 86400)
          for table, column in kept_like_inbox),
    ):
        status = await pool_or_conn.execute(sql, float(age))
        out[name] = int(status.split()[-1])
    return out
