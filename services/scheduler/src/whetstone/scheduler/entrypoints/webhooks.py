"""Tenant webhooks: `POST/GET/DELETE /v1/webhooks`, the delivery log, the handlers that queue
deliveries for model events, and the background sender.

A delivery row is written in the transaction that makes the change (a job's terminal status, by a
database trigger whatever path made it; a model event, by its handler): an outbox. The sender
claims due rows, POSTs them outside any transaction and records the outcome; a failure is tried
again with exponential backoff.

A webhook reaches only public addresses (or the operator's allow-list): a URL's host is judged as
written and, for a name, every address it resolves to, at registration and again at each delivery,
which connects to the address it judged (Host header and TLS SNI name the host: a name that
resolves elsewhere a moment later is never asked again). One deadline covers a whole delivery;
redirects are not followed, the receiver's body is never read, and the tenant sees only the
status code and its class, never the receiver's or the network's text."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from datetime import timedelta
from typing import Annotated, Any, Literal

import asyncpg
import httpx
from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from whetstone.contracts import Envelope, ModelPromotedV1, ModelRegisteredV1
from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import ListObject, list_object, not_found as missing
from whetstone.runtime.identity import Caller, internal_secret, require
from whetstone.runtime.messaging import UnitOfWork
from whetstone.runtime.service import Handler, Runtime

from ..adapters.secret_box import SecretBox
from ..adapters.webhooks import Delivery, DueDelivery, Webhook, WebhookStore
from ..context import Resolver, SchedulerContext
from ..domain import webhooks as rules
from ..domain.addresses import Address, AddressError, AllowList, pin

Rt = Runtime[SchedulerContext]


class WebhookObject(BaseModel):
    """A webhook as the API shows it."""
    object: Literal["webhook"] = "webhook"
    id: str
    url: str
    events: list[str]
    description: str
    created_at: int

    @classmethod
    def of(cls, hook: Webhook) -> WebhookObject:
        return cls(id=hook.webhook_id, url=hook.url, events=hook.events, description=hook.description,
                   created_at=int(hook.created_at.timestamp()))


class WebhookCreated(WebhookObject):
    secret: str   # shown once: only signatures carry it afterwards


class DeliveryObject(BaseModel):
    """One attempt log row; `next_attempt_at` only while the delivery is still pending."""
    object: Literal["webhook.delivery"] = "webhook.delivery"
    id: str
    webhook_id: str
    event_id: str
    event_type: str
    status: str
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_attempt_at: int | None
    created_at: int
    updated_at: int

    @classmethod
    def of(cls, d: Delivery) -> DeliveryObject:
        return cls(id=str(d.delivery_id), webhook_id=d.webhook_id, event_id=d.event_id, event_type=d.event_type,
                   status=d.status, attempts=d.attempts, last_status_code=d.last_status_code,
                   last_error=d.last_error,
                   next_attempt_at=int(d.next_attempt_at.timestamp()) if d.status == "pending" else None,
                   created_at=int(d.created_at.timestamp()), updated_at=int(d.updated_at.timestamp()))


class WebhookDeleted(BaseModel):
    object: Literal["webhook.deleted"] = "webhook.deleted"
    id: str
    deleted: bool = True


class CreateWebhook(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, max_length=2048)
    events: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list, max_length=len(rules.EVENT_TYPES))
    description: str = Field(default="", max_length=500)


def secret_box(rt: Rt) -> SecretBox:
    """What seals the webhooks' signing secrets at rest: a key derived from the internal secret."""
    return SecretBox.from_internal_secret(internal_secret(rt.settings.data_dir))


def routes(rt: Rt) -> APIRouter:
    r = APIRouter(prefix="/v1/webhooks")
    box = secret_box(rt)

    def not_found(webhook_id: str) -> ApiError:
        return missing(f"No webhook found with id {webhook_id!r}", code="webhook_not_found", param="webhook_id")

    @r.post("")
    async def create(body: CreateWebhook, caller: Caller = require("write")) -> WebhookCreated:
        cfg = rt.ctx.config
        allow = AllowList.parse(cfg.webhook_allow_hosts)
        try:
            target, events = rules.check_url(body.url, allow), rules.check_events(body.events)
            if target.address is None:   # a name: every address it resolves to now must be allowed too
                await resolve_pinned(rt.ctx.resolve_host, target, allow, cfg.webhook_timeout_s)
        except rules.WebhookError as exc:
            raise ApiError(400, exc.message, code="invalid_value", param=exc.param) from exc
        secret = "whsec_" + secrets.token_urlsafe(32)
        async with rt.uow() as uow:
            store = WebhookStore(uow.conn, box)
            if await store.count(caller.tenant_id) >= cfg.webhook_max_per_tenant:
                raise ApiError(400, f"a tenant may have at most {cfg.webhook_max_per_tenant} webhooks; delete one "
                               "first", code="webhook_limit_reached", param="url")
            hook = await store.add(f"wh_{secrets.token_hex(12)}", caller.tenant_id, body.url, events,
                                   secret, body.description, rt.ctx.clock())
        return WebhookCreated(**WebhookObject.of(hook).model_dump(), secret=secret)

    @r.get("")
    async def list_hooks(caller: Caller = require("read")) -> ListObject[WebhookObject]:
        async with rt.uow() as uow:
            hooks = await WebhookStore(uow.conn).list(caller.tenant_id)
        return list_object([WebhookObject.of(h) for h in hooks])

    @r.get("/{webhook_id}")
    async def get(webhook_id: str, caller: Caller = require("read")) -> WebhookObject:
        async with rt.uow() as uow:
            hook = await WebhookStore(uow.conn).get(caller.tenant_id, webhook_id)
        if hook is None:
            raise not_found(webhook_id)
        return WebhookObject.of(hook)

    @r.delete("/{webhook_id}")
    async def delete(webhook_id: str, caller: Caller = require("write")) -> WebhookDeleted:
        async with rt.uow() as uow:
            if not await WebhookStore(uow.conn).delete(caller.tenant_id, webhook_id, rt.ctx.clock()):
                raise not_found(webhook_id)
        return WebhookDeleted(id=webhook_id)

    @r.get("/{webhook_id}/deliveries")
    async def deliveries(webhook_id: str, caller: Caller = require("read"),
                         limit: int = Query(50, ge=1, le=500)) -> ListObject[DeliveryObject]:
        async with rt.uow() as uow:
            store = WebhookStore(uow.conn)
            if await store.get(caller.tenant_id, webhook_id) is None:
                raise not_found(webhook_id)
            rows = await store.deliveries(webhook_id, limit)
        return list_object([DeliveryObject.of(d) for d in rows], len(rows) == limit)

    return r


# ------------------------------------------------------------------ model events -> deliveries

def notifying(handler: Handler) -> Handler:
    """`handler`, then a delivery per matching webhook of the event's tenant, in the same transaction."""

    async def handle(rt: Rt, uow: UnitOfWork, env: Envelope, ev: Any) -> None:
        await handler(rt, uow, env, ev)
        await on_model_event(rt, uow, env, ev)

    handle.__name__ = handle.__qualname__ = getattr(handler, "__name__", "handle")
    return handle


async def on_model_event(rt: Rt, uow: UnitOfWork, env: Envelope, ev: ModelRegisteredV1 | ModelPromotedV1) -> None:
    if env.tenant_id:
        await WebhookStore(uow.conn).enqueue(env.tenant_id, env.event_type, str(env.event_id), ev)


# ------------------------------------------------------------------ the sender

def body_of(row: DueDelivery) -> bytes:
    payload = row.payload
    return json.dumps({"id": row.event_id, "object": "event", "type": row.event_type,
                       "created_at": int(row.created_at.timestamp()), "organization_id": row.tenant_id,
                       "data": payload}, separators=(",", ":"), sort_keys=True).encode()


async def resolve_pinned(resolve: Resolver, target: rules.Target, allow: AllowList, timeout_s: float) -> Address:
    """The address to connect to: the literal, or the first of the name's addresses once all are
    judged allowed. WebhookError (param url) otherwise, naming no address the name resolved to."""
    if target.address is not None:
        return target.address
    try:
        async with asyncio.timeout(timeout_s):
            resolved = await resolve(target.host, target.port)
    except (OSError, TimeoutError) as exc:
        raise rules.WebhookError("url", f"host {target.host!r} could not be resolved") from exc
    try:
        return pin(target.host, target.port, resolved, allow)
    except AddressError as exc:
        raise rules.WebhookError("url", exc.reason) from exc


async def deliver(http: httpx.AsyncClient, row: DueDelivery, allow: AllowList, resolve: Resolver,
                  deadline_s: float) -> tuple[int | None, str | None]:
    """(status code, the error the tenant sees: a status class or a fixed phrase, never a receiver's text)."""
    if row.secret is None:
        return None, "the webhook's signing secret is unreadable: delete the webhook and create it again"
    body = body_of(row)
    headers = {"Content-Type": "application/json", "User-Agent": "whetstone-webhooks/1",
               rules.SIGNATURE_HEADER: rules.sign(row.secret, int(time.time()), body),
               rules.EVENT_ID_HEADER: row.event_id, rules.EVENT_TYPE_HEADER: row.event_type}
    try:
        async with asyncio.timeout(deadline_s):
            target = rules.check_url(row.url, allow)          # judged again: the allow-list may have changed
            address = await resolve_pinned(resolve, target, allow, deadline_s)
            extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
            async with http.stream("POST", target.url_to(address), content=body,   # redirects are never followed
                                   headers={**headers, "Host": target.host_header}, extensions=extensions) as resp:
                code = resp.status_code                          # the body is never read
    except rules.WebhookError:
        return None, "refused: the URL's host is not a public address"
    except TimeoutError:
        return None, f"no answer within {deadline_s:g} s"
    except httpx.HTTPError:
        return None, "connection failed"
    if 200 <= code < 300:
        return code, None
    return code, rules.status_class(code) + (" (redirects are not followed)" if 300 <= code < 400 else "")


async def send_due(rt: Rt, http: httpx.AsyncClient, box: SecretBox) -> int:
    """One round: claim due deliveries (short transaction), POST them, record each outcome."""
    cfg, clock = rt.ctx.config, rt.ctx.clock
    lease = timedelta(seconds=cfg.webhook_timeout_s * 4 + 10)
    async with rt.uow() as uow:
        rows = await WebhookStore(uow.conn, box).claim(clock(), lease, cfg.webhook_batch)
    if not rows:
        return 0
    allow = AllowList.parse(cfg.webhook_allow_hosts)
    results = await asyncio.gather(*(deliver(http, row, allow, rt.ctx.resolve_host, cfg.webhook_timeout_s)
                                     for row in rows))
    async with rt.uow() as uow:
        store = WebhookStore(uow.conn)
        for row, (code, error) in zip(rows, results, strict=True):
            now = clock()
            status = rules.outcome(code, row.attempts, cfg.webhook_max_attempts)
            delay = rules.next_delay_s(row.attempts, cfg.webhook_backoff_s)
            await store.record(row.delivery_id, status, code, error, now + timedelta(seconds=delay), now)
            rt.log.info("webhook delivery", webhook_id=row.webhook_id, event_id=row.event_id,
                        attempt=row.attempts, status=status, status_code=code, error=error)
    return len(rows)


async def send_webhooks(rt: Rt) -> None:
    """Background: never blocks a consumer; a slow receiver holds only this loop, for the timeout."""
    cfg = rt.ctx.config
    timeout = httpx.Timeout(cfg.webhook_timeout_s, connect=min(cfg.webhook_timeout_s, 3.0))
    # no connection is kept: each delivery connects to the address it judged just before
    limits = httpx.Limits(max_keepalive_connections=0)
    box = secret_box(rt)
    async with rt.uow() as uow:
        if resealed := await WebhookStore(uow.conn, box).reseal_legacy():
            rt.log.info("webhook secrets sealed at rest", count=resealed)
    async with httpx.AsyncClient(follow_redirects=False, timeout=timeout, trust_env=False, limits=limits) as http:
        while True:
            try:
                sent = await send_due(rt, http, box)
            except (asyncpg.PostgresError, OSError) as exc:   # the database away for a moment: try again next round
                rt.log.warning("webhook sender round failed", error=str(exc))
                sent = 0
            if not sent:
                await asyncio.sleep(cfg.webhook_poll_s)
