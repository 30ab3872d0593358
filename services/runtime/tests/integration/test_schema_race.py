"""Replicas of one service starting together on a fresh database each create its schema."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from whetstone.runtime import db

pytestmark = pytest.mark.integration


async def test_a_replica_starting_while_another_creates_the_schema_gets_its_pool(settings):
    """One replica is inside its schema creation (lock taken, CREATE SCHEMA done, not committed yet)
    when another starts: the second waits for it and finds the schema, instead of failing on
    pg_namespace's unique index when the first commits."""
    schema = f"race_{uuid.uuid4().hex[:8]}"
    first = await asyncpg.connect(settings.database_url)
    try:
        tx = first.transaction()
        await tx.start()
        await first.execute("SELECT pg_advisory_xact_lock($1)", db.lock_key(schema))
        await first.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        second = asyncio.create_task(db.create_pool(settings.database_url, schema, min_size=1, max_size=1))
        await asyncio.sleep(0.3)
        assert not second.done()          # waiting for the first replica
        await tx.commit()
        pool = await asyncio.wait_for(second, 10)
        assert await pool.fetchval("SELECT current_schema()") == schema
        await pool.close()
    finally:
        await first.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await first.close()
