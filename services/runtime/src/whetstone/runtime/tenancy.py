"""Whose aggregate is this? Every consumer refuses an event whose envelope names another tenant than
the one that owns the job or model it is about (issue 20, point 4), before its handler runs.

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

from .delivery import PoisonMessage
from .identity import PLATFORM_TENANT

PLATFORM_TOPICS = frozenset({"node.heartbeat", "base_model.updated"})   # only the platform speaks for these
OWNED = ("job_id", "model_id")   # the aggregates a tenant owns, by the payload field that names them


async def check_tenant(conn: asyncpg.Connection, topic: str, env: Envelope, event: Any) -> None:
    """Raise `PoisonMessage(tenant_mismatch)` when `env` speaks for a tenant that does not own what
    `event` is about; otherwise record the owners first seen here."""
    if topic in PLATFORM_TOPICS:
        if env.tenant_id != PLATFORM_TENANT:
            raise PoisonMessage(f"{topic} names tenant {env.tenant_id!r}; only {PLATFORM_TENANT!r} publishes it",
                                reason="tenant_mismatch")
        return
    for kind in OWNED:
        value = getattr(event, kind, None)
        if not isinstance(value, str) or not value:
            continue
        owner = await conn.fetchval(
            "WITH new AS (INSERT INTO owners (kind, id, tenant_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING"
            " RETURNING tenant_id) SELECT tenant_id FROM new UNION ALL"
            " SELECT tenant_id FROM owners WHERE kind = $1 AND id = $2 LIMIT 1", kind, value, env.tenant_id)
        if owner is None:   # a concurrent transaction inserted it after this statement's snapshot
            owner = await conn.fetchval("SELECT tenant_id FROM owners WHERE kind = $1 AND id = $2", kind, value)
        if owner != env.tenant_id:
            raise PoisonMessage(f"{topic} about {kind.removesuffix('_id')} {value} names tenant {env.tenant_id!r}, "
                                f"not its owner", reason="tenant_mismatch")
