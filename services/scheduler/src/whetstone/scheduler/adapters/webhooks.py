"""Postgres side of tenant webhooks: the hooks, the delivery outbox (rows written in the handler's
transaction), claiming due deliveries (SKIP LOCKED: several scheduler replicas never send one
twice at once) and recording each attempt. Also the system resolver the sender pins addresses with."""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import asyncpg
from whetstone.contracts.base import Contract

from .secret_box import PREFIX, SecretBox, SecretUnreadable


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for `host` (a name: literals never come here)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


# the columns each record is read from (a row of them maps field by field onto the record)
_HOOK = "webhook_id, url, events, description, created_at"
_DELIVERY = ("delivery_id, webhook_id, event_id, event_type, status, attempts, last_status_code, last_error,"
             " next_attempt_at, created_at, updated_at")


@dataclass(frozen=True)
class Webhook:
    """A tenant's live webhook (its sealed secret stays in the database)."""
    webhook_id: str
    url: str
    events: list[str]
    description: str
    created_at: datetime


@dataclass(frozen=True)
class Delivery:
    """One row of a webhook's delivery log."""
    delivery_id: int
    webhook_id: str
    event_id: str
    event_type: str
    status: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_attempt_at: datetime
    created_at: datetime
    updated_at: datetime


def _webhook(row: asyncpg.Record) -> Webhook:
    return Webhook(**row)


def _delivery(row: asyncpg.Record) -> Delivery:
    return Delivery(**row)


@dataclass(frozen=True)
class DueDelivery:
    """A claimed delivery with its webhook's url and (opened) secret: what the sender posts."""
    delivery_id: int
    event_id: str
    event_type: str
    payload: dict[str, Any]   # the event's JSON document, posted as the body's `data`
    tenant_id: str
    attempts: int
    created_at: datetime
    url: str
    secret: str | None   # None: sealed under another key (or altered); nothing is sent
    webhook_id: str

    @classmethod
    def of(cls, row: asyncpg.Record, box: SecretBox) -> DueDelivery:
        claimed = cls(**row)   # payload as the driver gives jsonb (text), secret still sealed
        payload = claimed.payload if isinstance(claimed.payload, dict) else json.loads(claimed.payload)
        try:
            secret = box.open(claimed.secret or "", claimed.webhook_id)   # the column is NOT NULL
        except SecretUnreadable:
            secret = None
        return replace(claimed, payload=payload, secret=secret)


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
                  description: str, now: datetime) -> Webhook:
        row = await self.conn.fetchrow(
            "INSERT INTO webhooks (webhook_id, tenant_id, url, events, secret, description, created_at)"
            f" VALUES ($1,$2,$3,$4,$5,$6,$7) RETURNING {_HOOK}", webhook_id, tenant_id, url, events,
            self.box.seal(secret, webhook_id), description, now)
        return _webhook(row)

    async def reseal_legacy(self) -> int:
        """Seal the secrets stored in plain text before encryption; returns how many."""
        rows = await self.conn.fetch("SELECT webhook_id, secret FROM webhooks WHERE secret NOT LIKE $1 || '%'"
                                     " FOR UPDATE", PREFIX)
        for webhook_id, plain in rows:
            await self.conn.execute("UPDATE webhooks SET secret = $2 WHERE webhook_id = $1", webhook_id,
                                    self.box.seal(plain, webhook_id))
        return len(rows)

    async def count(self, tenant_id: str) -> int:
        """The tenant's live webhooks, read under a lock on the tenant's rows (two creates at once
        cannot both pass the cap)."""
        await self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('webhooks:' || $1))", tenant_id)
        return await self.conn.fetchval("SELECT count(*) FROM webhooks WHERE tenant_id = $1 AND deleted_at IS NULL",
                                        tenant_id)

    async def get(self, tenant_id: str, webhook_id: str) -> Webhook | None:
        row = await self.conn.fetchrow(f"SELECT {_HOOK} FROM webhooks WHERE webhook_id = $1 AND tenant_id = $2"
                                       " AND deleted_at IS NULL", webhook_id, tenant_id)
        return _webhook(row) if row else None

    async def list(self, tenant_id: str) -> list[Webhook]:
        rows = await self.conn.fetch(f"SELECT {_HOOK} FROM webhooks WHERE tenant_id = $1 AND deleted_at IS NULL"
                                     " ORDER BY created_at, webhook_id", tenant_id)
        return [_webhook(r) for r in rows]

    async def delete(self, tenant_id: str, webhook_id: str, now: datetime) -> bool:
        """Soft delete (the delivery log stays); pending deliveries are dropped."""
        done = await self.conn.fetchval("UPDATE webhooks SET deleted_at = $3 WHERE webhook_id = $1 AND tenant_id = $2"
                                        " AND deleted_at IS NULL RETURNING true", webhook_id, tenant_id, now)
        if done:
            await self.conn.execute("UPDATE webhook_deliveries SET status = 'cancelled', updated_at = $2"
                                    " WHERE webhook_id = $1 AND status = 'pending'", webhook_id, now)
        return bool(done)

    async def deliveries(self, webhook_id: str, limit: int) -> list[Delivery]:
        rows = await self.conn.fetch(f"SELECT {_DELIVERY} FROM webhook_deliveries WHERE webhook_id = $1"
                                     " ORDER BY delivery_id DESC LIMIT $2", webhook_id, limit)
        return [_delivery(r) for r in rows]

    async def enqueue(self, tenant_id: str, event_type: str, event_id: str, payload: Contract) -> int:
        """One delivery per matching webhook of the tenant; the same event twice is queued once."""
        result = await self.conn.execute(
            "INSERT INTO webhook_deliveries (webhook_id, tenant_id, event_id, event_type, payload)"
            " SELECT webhook_id, tenant_id, $2, $3, $4::jsonb FROM webhooks WHERE tenant_id = $1"
            " AND deleted_at IS NULL AND (cardinality(events) = 0 OR $3 = ANY(events))"
            " ON CONFLICT (webhook_id, event_id) DO NOTHING", tenant_id, event_id, event_type,
            payload.model_dump_json(exclude_none=True))
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
