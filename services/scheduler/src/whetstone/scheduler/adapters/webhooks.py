"""Postgres side of tenant webhooks: the hooks, the delivery outbox (rows written in the handler's
transaction), claiming due deliveries (SKIP LOCKED: several scheduler replicas never send one
twice at once) and recording each attempt. Also the system resolver the sender pins addresses with."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from .secret_box import PREFIX, SecretBox, SecretUnreadable


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host` (a name: literals never come here)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def hook_view(row: asyncpg.Record) -> dict[str, Any]:
    return {"object": "webhook", "id": row["webhook_id"], "url": row["url"], "events": list(row["events"]),
            "description": row["description"], "created_at": int(row["created_at"].timestamp())}


def delivery_view(row: asyncpg.Record) -> dict[str, Any]:
    return {"object": "webhook.delivery", "id": str(row["delivery_id"]), "webhook_id": row["webhook_id"],
            "event_id": row["event_id"], "event_type": row["event_type"], "status": row["status"],
            "attempts": row["attempts"], "last_status_code": row["last_status_code"], "last_error": row["last_error"],
            "next_attempt_at": int(row["next_attempt_at"].timestamp()) if row["status"] == "pending" else None,
            "created_at": int(row["created_at"].timestamp()), "updated_at": int(row["updated_at"].timestamp())}


@dataclass(frozen=True)
class DueDelivery:
    """A claimed delivery with its webhook's url and (opened) secret: what the sender posts."""
    delivery_id: int
    event_id: str
    event_type: str
    payload: dict[str, Any]
    tenant_id: str
    attempts: int
    created_at: datetime
    url: str
    secret: str | None   # None: sealed under another key (or altered); nothing is sent
    webhook_id: str

    @classmethod
    def of(cls, row: asyncpg.Record, box: SecretBox) -> DueDelivery:
        fields = dict(row)
        if not isinstance(fields["payload"], dict):
            fields["payload"] = json.loads(fields["payload"])
        try:
            fields["secret"] = box.open(fields["secret"], fields["webhook_id"])
        except SecretUnreadable:
            fields["secret"] = None
        return cls(**fields)


class WebhookStore:
    """The tenants' webhooks and their deliveries. Signing secrets are stored sealed by `box`
    (`secret_box.py`): only `add` and `claim` need it."""

    def __init__(self, conn: asyncpg.Connection, box: SecretBox | None = None) -> None:
        self.conn, self._box = conn, box

    @property
    def box(self) -> SecretBox:
        if self._box is None:
            raise RuntimeError("WebhookStore: signing secrets are read or written only with a SecretBox")
        return self._box

    async def add(self, webhook_id: str, tenant_id: str, url: str, events: list[str], secret: str,
                  description: str, now: datetime) -> dict[str, Any]:
        row = await self.conn.fetchrow(
            "INSERT INTO webhooks (webhook_id, tenant_id, url, events, secret, description, created_at)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7) RETURNING *", webhook_id, tenant_id, url, events,
            self.box.seal(secret, webhook_id), description, now)
        return hook_view(row)

    async def reseal_legacy(self) -> int:
        """Seal the secrets stored in plain text before encryption; returns how many."""
        rows = await self.conn.fetch("SELECT webhook_id, secret FROM webhooks WHERE secret NOT LIKE $1 || '%'"
                                     " FOR UPDATE", PREFIX)
        for r in rows:
            await self.conn.execute("UPDATE webhooks SET secret = $2 WHERE webhook_id = $1", r["webhook_id"],
                                    self.box.seal(r["secret"], r["webhook_id"]))
        return len(rows)

    async def count(self, tenant_id: str) -> int:
        """The tenant's live webhooks, read under a lock on the tenant's rows (two creates at once
        cannot both pass the cap)."""
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('webhooks:' || $1))", tenant_id)
        return await self.conn.fetchval("SELECT count(*) FROM webhooks WHERE tenant_id = $1 AND deleted_at IS NULL",
                                        tenant_id)

    async def get(self, tenant_id: str, webhook_id: str) -> dict[str, Any] | None:
        row = await self.conn.fetchrow("SELECT * FROM webhooks WHERE webhook_id = $1 AND tenant_id = $2"
                                       " AND deleted_at IS NULL", webhook_id, tenant_id)
        return hook_view(row) if row else None

    async def list(self, tenant_id: str) -> list[dict[str, Any]]:
        rows = await self.conn.fetch("SELECT * FROM webhooks WHERE tenant_id = $1 AND deleted_at IS NULL"
                                     " ORDER BY created_at, webhook_id", tenant_id)
        return [hook_view(r) for r in rows]

    async def delete(self, tenant_id: str, webhook_id: str, now: datetime) -> bool:
        """Soft delete (the delivery log stays); pending deliveries are dropped."""
        done = await self.conn.fetchval("UPDATE webhooks SET deleted_at = $3 WHERE webhook_id = $1 AND tenant_id = $2"
                                        " AND deleted_at IS NULL RETURNING true", webhook_id, tenant_id, now)
        if done:
            await self.conn.execute("UPDATE webhook_deliveries SET status = 'cancelled', updated_at = $2"
                                    " WHERE webhook_id = $1 AND status = 'pending'", webhook_id, now)
        return bool(done)

    async def deliveries(self, webhook_id: str, limit: int) -> list[dict[str, Any]]:
        rows = await self.conn.fetch("SELECT * FROM webhook_deliveries WHERE webhook_id = $1"
                                     " ORDER BY delivery_id DESC LIMIT $2", webhook_id, limit)
        return [delivery_view(r) for r in rows]

    async def enqueue(self, tenant_id: str, event_type: str, event_id: str, payload: dict[str, Any]) -> int:
        """One delivery per matching webhook of the tenant; the same event twice is queued once."""
        result = await self.conn.execute(
            "INSERT INTO webhook_deliveries (webhook_id, tenant_id, event_id, event_type, payload)"
            " SELECT webhook_id, tenant_id, $2, $3, $4::jsonb FROM webhooks WHERE tenant_id = $1"
            " AND deleted_at IS NULL AND (cardinality(events) = 0 OR $3 = ANY(events))"
            " ON CONFLICT (webhook_id, event_id) DO NOTHING", tenant_id, event_id, event_type, json.dumps(payload))
        return int(result.split()[-1])

    async def claim(self, now: datetime, lease: timedelta, limit: int) -> list[DueDelivery]:
        """Due deliveries, pushed `lease` into the future so that no other sender takes them meanwhile."""
        rows = await self.conn.fetch(
            "WITH due AS (SELECT delivery_id FROM webhook_deliveries WHERE status = 'pending'"
            "  AND next_attempt_at <= $1 ORDER BY next_attempt_at LIMIT $3 FOR UPDATE SKIP LOCKED)"
            " UPDATE webhook_deliveries d SET next_attempt_at = $1 + $2, attempts = d.attempts + 1, updated_at = $1"
            " FROM due, webhooks w WHERE d.delivery_id = due.delivery_id AND w.webhook_id = d.webhook_id"
            " RETURNING d.delivery_id, d.event_id, d.event_type, d.payload, d.tenant_id, d.attempts, d.created_at,"
            " w.url, w.secret, w.webhook_id", now, lease, limit)
        return [DueDelivery.of(r, self.box) for r in rows]

    async def record(self, delivery_id: int, status: str, status_code: int | None, error: str | None,
                     next_attempt_at: datetime, now: datetime) -> None:
        await self.conn.execute(
            "UPDATE webhook_deliveries SET status = $2, last_status_code = $3, last_error = $4,"
            " next_attempt_at = $5, updated_at = $6 WHERE delivery_id = $1 AND status = 'pending'",
            delivery_id, status, status_code, error, next_attempt_at, now)
