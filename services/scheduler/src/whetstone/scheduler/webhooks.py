"""Tenant webhooks: `POST/GET/DELETE /v1/webhooks`, the delivery log, the handlers that queue
deliveries for model events, and the background sender.

A delivery row is written in the transaction that makes the change (a job's terminal status, by a
database trigger whatever path made it; a model event, by its handler): an outbox. The sender
claims due rows, POSTs them outside any transaction (signed, no redirects followed, a short
timeout) and records the outcome; a failure is tried again with exponential backoff."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from whetstone.contracts import Envelope, ModelPromotedV1, ModelRegisteredV1
from whetstone.runtime.errors import ApiError
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Handler, Runtime

from .adapters.webhooks import WebhookStore
from .context import SchedulerContext
from .domain import webhooks as rules

Rt = Runtime[SchedulerContext]


class CreateWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=2048)
    events: list[str] = Field(default_factory=list, max_length=len(rules.EVENT_TYPES))
    description: str = Field(default="", max_length=500)


def routes(rt: Rt) -> APIRouter:
    r = APIRouter(prefix="/v1/webhooks")

    def not_found(webhook_id: str) -> ApiError:
        return ApiError(404, f"No webhook found with id {webhook_id!r}", code="webhook_not_found", param="webhook_id")

    @r.post("")
    async def create(body: CreateWebhook, caller: Caller = require("write")) -> dict:
        try:
            url, events = rules.check_url(body.url), rules.check_events(body.events)
        except rules.WebhookError as exc:
            raise ApiError(400, exc.message, code="invalid_value", param=exc.param) from exc
        secret = "whsec_" + secrets.token_urlsafe(32)
        async with rt.uow() as uow:
            hook = await WebhookStore(uow.conn).add(f"wh_{secrets.token_hex(12)}", caller.tenant_id, url, events,
                                                    secret, body.description, rt.ctx.clock())
        return {**hook, "secret": secret}   # shown once: only signatures carry it afterwards

    @r.get("")
    async def list_hooks(caller: Caller = require("read")) -> dict:
        async with rt.uow() as uow:
            data = await WebhookStore(uow.conn).list(caller.tenant_id)
        return {"object": "list", "data": data, "has_more": False}

    @r.get("/{webhook_id}")
    async def get(webhook_id: str, caller: Caller = require("read")) -> dict:
        async with rt.uow() as uow:
            hook = await WebhookStore(uow.conn).get(caller.tenant_id, webhook_id)
        if hook is None:
            raise not_found(webhook_id)
        return hook

    @r.delete("/{webhook_id}")
    async def delete(webhook_id: str, caller: Caller = require("write")) -> dict:
        async with rt.uow() as uow:
            if not await WebhookStore(uow.conn).delete(caller.tenant_id, webhook_id, rt.ctx.clock()):
                raise not_found(webhook_id)
        return {"object": "webhook.deleted", "id": webhook_id, "deleted": True}

    @r.get("/{webhook_id}/deliveries")
    async def deliveries(webhook_id: str, caller: Caller = require("read"),
                         limit: int = Query(50, ge=1, le=500)) -> dict:
        async with rt.uow() as uow:
            store = WebhookStore(uow.conn)
            if await store.get(caller.tenant_id, webhook_id) is None:
                raise not_found(webhook_id)
            data = await store.deliveries(webhook_id, limit)
        return {"object": "list", "data": data, "has_more": len(data) == limit}

    return r


# ------------------------------------------------------------------ model events -> deliveries

def _model_payload(ev: ModelRegisteredV1 | ModelPromotedV1) -> dict[str, Any]:
    return ev.model_dump(mode="json", exclude_none=True)


def notifying(handler: Handler) -> Handler:
    """`handler`, then a delivery per matching webhook of the event's tenant, in the same transaction."""

    async def handle(rt: Rt, uow: UnitOfWork, env: Envelope, ev: Any) -> None:
        await handler(rt, uow, env, ev)
        await on_model_event(rt, uow, env, ev)

    handle.__name__ = handle.__qualname__ = getattr(handler, "__name__", "handle")
    return handle


async def on_model_event(rt: Rt, uow: UnitOfWork, env: Envelope, ev: ModelRegisteredV1 | ModelPromotedV1) -> None:
    if env.tenant_id:
        await WebhookStore(uow.conn).enqueue(env.tenant_id, env.event_type, str(env.event_id), _model_payload(ev))


# ------------------------------------------------------------------ the sender

def body_of(row: Any) -> bytes:
    payload = row["payload"] if isinstance(row["payload"], dict) else json.loads(row["payload"])
    return json.dumps({"id": row["event_id"], "object": "event", "type": row["event_type"],
                       "created_at": int(row["created_at"].timestamp()), "organization_id": row["tenant_id"],
                       "data": payload}, separators=(",", ":"), sort_keys=True).encode()


async def deliver(http: httpx.AsyncClient, row: Any) -> tuple[int | None, str | None]:
    body = body_of(row)
    headers = {"Content-Type": "application/json", "User-Agent": "whetstone-webhooks/1",
               rules.SIGNATURE_HEADER: rules.sign(row["secret"], int(time.time()), body),
               rules.EVENT_ID_HEADER: row["event_id"], rules.EVENT_TYPE_HEADER: row["event_type"]}
    try:
        resp = await http.post(row["url"], content=body, headers=headers)   # redirects are never followed
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]
    error = None if resp.is_success else f"HTTP {resp.status_code}" + (
        f" (redirect to {resp.headers.get('location')!r} not followed)" if resp.is_redirect else "")
    return resp.status_code, error


async def send_due(rt: Rt, http: httpx.AsyncClient) -> int:
    """One round: claim due deliveries (short transaction), POST them, record each outcome."""
    cfg, clock = rt.ctx.config, rt.ctx.clock
    lease = timedelta(seconds=cfg.webhook_timeout_s * 4 + 10)
    async with rt.uow() as uow:
        rows = await WebhookStore(uow.conn).claim(clock(), lease, cfg.webhook_batch)
    if not rows:
        return 0
    results = await asyncio.gather(*(deliver(http, row) for row in rows))
    async with rt.uow() as uow:
        store = WebhookStore(uow.conn)
        for row, (code, error) in zip(rows, results, strict=True):
            now = clock()
            status = rules.outcome(code, row["attempts"], cfg.webhook_max_attempts)
            delay = rules.next_delay_s(row["attempts"], cfg.webhook_backoff_s)
            await store.record(row["delivery_id"], status, code, error, now + timedelta(seconds=delay), now)
            rt.log.info("webhook delivery", webhook_id=row["webhook_id"], event_id=row["event_id"],
                        attempt=row["attempts"], status=status, status_code=code, error=error)
    return len(rows)


async def send_webhooks(rt: Rt) -> None:
    """Background: never blocks a consumer; a slow receiver holds only this loop, for the timeout."""
    cfg = rt.ctx.config
    timeout = httpx.Timeout(cfg.webhook_timeout_s, connect=min(cfg.webhook_timeout_s, 3.0))
    async with httpx.AsyncClient(follow_redirects=False, timeout=timeout, trust_env=False) as http:
        while True:
            try:
                sent = await send_due(rt, http)
            except (asyncpg.PostgresError, OSError) as exc:   # the database away for a moment: try again next round
                rt.log.warning("webhook sender round failed", error=str(exc))
                sent = 0
            if not sent:
                await asyncio.sleep(cfg.webhook_poll_s)
