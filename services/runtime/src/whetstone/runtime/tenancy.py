"""Whose aggregate is this? Every consumer refuses an event whose envelope names another tenant than
the one that owns the job or model it is about, before its handler runs.

The owner is the tenant of the first event naming the aggregate that this service handled (for a
job: the scheduler's `job.queued` or `job.assigned`; for a model: `model.registered`), kept in the
service's own `owners` table (a runtime migration, db.py) in the handler's transaction. Node-level and base-model events belong
to the platform. A refusal is a `PoisonMessage(reason="tenant_mismatch")`: dead-lettered, counted in
`whetstone_refused_total{reason}`. In production the per-service Kafka ACLs already keep tenants off
internal topics; this is the check that holds where they are missing (the embedded broker) or wrong.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from whetstone.contracts import Envelope

from .db import claim_inbox
from .delivery import PoisonMessage
from .identity import PLATFORM_TENANT

PLATFORM_TOPICS = frozenset({"node.heartbeat", "base_model.updated"})   # only the platform speaks for these
OWNED = ("job_id", "model_id")   # the aggregates a tenant owns, by the payload field that names them


def _owned(topic: str, event: Any) -> list[tuple[str, str]]:
    """(kind, id) of each aggregate a tenant owns that `event` is about."""
    if topic in PLATFORM_TOPICS:
        return []
    return [(kind, value) for kind in OWNED if isinstance(value := getattr(event, kind, None), str) and value]


def _check_platform(topic: str, env: Envelope) -> None:
    if topic in PLATFORM_TOPICS and env.tenant_id != PLATFORM_TENANT:
        raise PoisonMessage(f"{topic} names tenant {env.tenant_id!r}; only {PLATFORM_TENANT!r} publishes it",
                            reason="tenant_mismatch")


async def _judge(conn: asyncpg.Connection, topic: str, env: Envelope, kind: str, value: str,
                 owner: str | None) -> None:
    if owner is None:   # a concurrent transaction inserted it after this statement's snapshot
        owner = await conn.fetchval("SELECT tenant_id FROM owners WHERE kind = $1 AND id = $2", kind, value)
    if owner != env.tenant_id:
        raise PoisonMessage(f"{topic} about {kind.removesuffix('_id')} {value} names tenant {env.tenant_id!r}, "
                            f"not its owner", reason="tenant_mismatch")


async def check_tenant(conn: asyncpg.Connection, topic: str, env: Envelope, event: Any) -> None:
    """Raise `PoisonMessage(tenant_mismatch)` when `env` speaks for a tenant that does not own what
    `event` is about; otherwise record the owners first seen here."""
    _check_platform(topic, env)
    for kind, value in _owned(topic, event):
        owner = await conn.fetchval(
            "WITH new AS (INSERT INTO owners (kind, id, tenant_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
            " RETURNING tenant_id) SELECT tenant_id FROM new UNION ALL"
            " SELECT tenant_id FROM owners WHERE kind = $1 AND id = $2 LIMIT 1", kind, value, env.tenant_id)
        await _judge(conn, topic, env, kind, value, owner)


# the inbox claim and the owners of what the event is about, in one statement: the owners are recorded
# (first tenant wins) only when the event is claimed, and read back for each (kind, id) in order
_CLAIM_AND_OWN = (
    "WITH claimed AS (INSERT INTO inbox (consumer, message_id, topic) VALUES ($1, $2, $3)"
    " ON CONFLICT DO NOTHING RETURNING 1),"
    " new AS (INSERT INTO owners (kind, id, tenant_id) SELECT k, i, $6 FROM unnest($4::text[], $5::text[]) AS u(k, i)"
    " WHERE EXISTS (SELECT 1 FROM claimed) ON CONFLICT DO NOTHING RETURNING kind, id, tenant_id)"
    " SELECT EXISTS (SELECT 1 FROM claimed) AS claimed,"
    " ARRAY(SELECT coalesce((SELECT n.tenant_id FROM new n WHERE n.kind = u.k AND n.id = u.i),"
    " (SELECT o.tenant_id FROM owners o WHERE o.kind = u.k AND o.id = u.i))"
    " FROM unnest($4::text[], $5::text[]) WITH ORDINALITY AS u(k, i, n) ORDER BY u.n) AS owners")


async def claim_and_check(conn: asyncpg.Connection, consumer: str, message_id: str, topic: str, env: Envelope,
                          event: Any) -> bool:
    """Claim the event in the inbox (False: this consumer handled it already) and, when claimed, do
    what `check_tenant` does; one round trip, inside the caller's transaction."""
    _check_platform(topic, env)
    owned = _owned(topic, event)
    if not owned:
        return await claim_inbox(conn, consumer, message_id, topic)
    row = await conn.fetchrow(_CLAIM_AND_OWN, consumer, message_id, topic, [k for k, _ in owned],
                              [v for _, v in owned], env.tenant_id)
    if not row["claimed"]:
        return False
    for (kind, value), owner in zip(owned, row["owners"], strict=True):
        await _judge(conn, topic, env, kind, value, owner)
    return True
