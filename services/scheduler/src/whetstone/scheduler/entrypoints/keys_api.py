"""API key routes. The scheduler owns tenants, so it owns their keys.

- `POST /internal/keys/verify`: the gateway's question "whose key is this?" (internal secret only).
- `POST /v1/keys`, `GET /v1/keys`, `POST /v1/keys/{id}/revoke`: an `admin` key manages its own
  tenant's keys; the internal secret (an operator's `whet keys`) manages any tenant's.
- The `platform` tenant is the operator's: its admin keys reach the operator routes (never a customer's data).
- `POST /v1/keys/producer_tokens`: a producer token for external `job.requested` producers (same
  rules; listed and revoked like a key, see `producer_tokens.py`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import ListObject, list_object, not_found as missing
from whetstone.runtime.identity import (
    PLATFORM_TENANT,
    PRODUCER_TOKEN_MAX_TTL_S,
    Caller,
    internal_secret,
    require_internal,
    require_or_internal,
)
from whetstone.runtime.service import Runtime

from ..adapters.keys import ApiKey, KeyError_, KeyStore
from ..context import SchedulerContext


class CreateKey(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant_id: str | None = Field(default=None, max_length=64, description="default: the caller's tenant")
    name: str = Field(default="", max_length=200)
    scopes: list[Annotated[str, StringConstraints(max_length=64)]] | None = Field(default=None, max_length=16)
    rate_limit_per_s: float | None = Field(default=None, gt=0, le=100_000)


class CreateProducerToken(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant_id: str | None = Field(default=None, max_length=64, description="default: the caller's tenant")
    name: str = Field(default="", max_length=200)
    expires_in: int | None = Field(default=None, ge=60, le=PRODUCER_TOKEN_MAX_TTL_S,
                                   description="seconds the token stays valid (default 90 days)")


class VerifyKey(BaseModel):
    key: str = Field(max_length=200)


class VerifiedKey(BaseModel):
    """The gateway's answer: whose key it is, what it may do, how fast."""
    key_id: str
    tenant_id: str
    scopes: list[str]
    rate_limit_per_s: float | None


def _ts(t: datetime | None) -> int | None:
    return int(t.timestamp()) if t else None


class KeyObject(BaseModel):
    """A key (or producer token) as the API shows it: never its secret, which only creation shows."""
    id: str
    object: Literal["api_key", "producer_token"]
    tenant_id: str
    name: str
    scopes: list[str]
    created_at: int | None
    last_used_at: int | None
    revoked_at: int | None
    rate_limit_per_s: float | None
    status: Literal["active", "revoked"]

    @classmethod
    def of(cls, key: ApiKey) -> KeyObject:
        return cls(id=key.key_id, object="producer_token" if key.producer else "api_key", tenant_id=key.tenant_id,
                   name=key.name, scopes=list(key.scopes), created_at=_ts(key.created_at),
                   last_used_at=_ts(key.last_used_at), revoked_at=_ts(key.revoked_at),
                   rate_limit_per_s=key.rate_limit_per_s, status="revoked" if key.revoked_at else "active")


class KeyCreated(KeyObject):
    key: str     # the full key: shown this once


class ProducerTokenCreated(KeyObject):
    token: str   # the signed token: shown this once


def routes(rt: Runtime[SchedulerContext]) -> APIRouter:
    assert rt.pool is not None
    keys = KeyStore(rt.pool, rt.ctx.clock)
    # the tenants keys are issued for: the customers, and the operator's own `platform` (its admin keys open
    # the operator routes, see Caller.operator; only the internal secret or a platform admin issues them)
    tenants = {*rt.settings.tenants, PLATFORM_TENANT}
    r = APIRouter()

    def not_found(key_id: str) -> ApiError:
        return missing(f"No API key {key_id}.", code="key_not_found", param="key_id")

    @r.post("/internal/keys/verify")
    async def verify(body: VerifyKey, _: Caller = require_internal()) -> VerifiedKey:
        key = await keys.verify(body.key)
        if key is None or key.tenant_id not in tenants:
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return VerifiedKey(key_id=key.key_id, tenant_id=key.tenant_id, scopes=list(key.scopes),
                           rate_limit_per_s=key.rate_limit_per_s)

    def tenant_for(caller: Caller, requested: str | None) -> str:
        tenant = requested or (None if caller.platform else caller.tenant_id)
        if tenant is None:
            raise ApiError(400, "tenant_id is required.", code="missing_tenant", param="tenant_id")
        if not caller.platform and tenant != caller.tenant_id:
            raise ApiError(404, f"No tenant {tenant}.", code="tenant_not_found", param="tenant_id")
        if tenant not in tenants:
            raise ApiError(404 if not caller.platform else 400,
                           f"Unknown tenant {tenant!r}; known: {', '.join(sorted(tenants))}.",
                           code="tenant_not_found", param="tenant_id")
        return tenant

    @r.post("/v1/keys")
    async def create(body: CreateKey, caller: Caller = require_or_internal("admin")) -> KeyCreated:
        tenant = tenant_for(caller, body.tenant_id)
        try:
            record, secret = await keys.create(tenant, name=body.name, scopes=body.scopes,
                                               rate_limit_per_s=body.rate_limit_per_s)
        except KeyError_ as exc:
            raise ApiError(400, exc.message, code=exc.code, param=exc.param) from exc
        return KeyCreated(**KeyObject.of(record).model_dump(), key=secret)

    @r.post("/v1/keys/producer_tokens")
    async def create_producer(body: CreateProducerToken,
                              caller: Caller = require_or_internal("admin")) -> ProducerTokenCreated:
        tenant = tenant_for(caller, body.tenant_id)
        try:
            record, token = await keys.create_producer(tenant, internal_secret(rt.settings.data_dir), name=body.name,
                                                        expires_in_s=body.expires_in)
        except ValueError as exc:
            raise ApiError(400, str(exc), code="invalid_tenant", param="tenant_id") from exc
        return ProducerTokenCreated(**KeyObject.of(record).model_dump(), token=token)

    @r.get("/v1/keys")
    async def list_keys(tenant_id: str | None = None,
                        caller: Caller = require_or_internal("admin")) -> ListObject[KeyObject]:
        tenant = tenant_id if caller.platform else caller.tenant_id
        return list_object([KeyObject.of(k) for k in await keys.list(tenant)])

    @r.post("/v1/keys/{key_id}/revoke")
    async def revoke(key_id: str, caller: Caller = require_or_internal("admin")) -> KeyObject:
        key = await keys.get(key_id)
        if key is None or (not caller.platform and key.tenant_id != caller.tenant_id):
            raise not_found(key_id)
        revoked = await keys.revoke(key_id)
        assert revoked is not None
        return KeyObject.of(revoked)

    return r
