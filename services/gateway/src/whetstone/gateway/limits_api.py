"""The operator's routes for tenant request rates, answered by the gateway itself (it enforces them):

- `GET /v1/operator/rate_limits`: every override;
- `PUT /v1/operator/rate_limits/{tenant_id}` `{"requests_per_s": N}`: set (raise or lower) a tenant's rate;
- `DELETE /v1/operator/rate_limits/{tenant_id}`: back to the deployment's setting.

Only the platform's operator (an `admin` key of the `platform` tenant) may call them: a tenant's own
admin key gets 403 `operator_only`, so no tenant changes its own rate. Overrides live in the
gateway's database (shared_limits.py) and reach every replica within `limits_ttl_s`."""

from __future__ import annotations

import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import ListObject, list_object, not_found, operator_only
from whetstone.runtime.identity import Caller

from .auth import Verdict
from .shared_limits import SharedTenantRates, TenantLimit

PREFIX = "/v1/operator/rate_limits"
TENANT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class RateLimitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requests_per_s: float = Field(gt=0, le=100_000, description="the tenant's requests per second, all keys "
                                  "and all gateway replicas together")


class RateLimitObject(BaseModel):
    object: Literal["tenant.rate_limit"] = "tenant.rate_limit"
    id: str = Field(description="the tenant id")
    tenant_id: str
    requests_per_s: float
    set_by: str = Field(description="the operator key that set it")
    set_at: int

    @classmethod
    def of(cls, limit: TenantLimit) -> RateLimitObject:
        return cls(id=limit.tenant_id, tenant_id=limit.tenant_id, requests_per_s=limit.requests_per_s,
                   set_by=limit.set_by, set_at=int(limit.set_at.timestamp()))


class RateLimitDeleted(BaseModel):
    object: Literal["tenant.rate_limit.deleted"] = "tenant.rate_limit.deleted"
    id: str
    deleted: bool


Answer = RateLimitObject | RateLimitDeleted | ListObject[RateLimitObject]


async def answer(rates: SharedTenantRates | None, method: str, path: str, body: bytes, verdict: Verdict) -> Answer:
    """The route's answer, or the ApiError that refuses it."""
    operator_only(Caller(verdict.tenant_id, verdict.key_id, frozenset(verdict.scopes)))
    if rates is None:
        raise ApiError(503, "Tenant rate limits are set in the gateway's database, and this gateway has none "
                            "(WHETSTONE_DATABASE_URL); set tenant_rate_limits in its settings instead.",
                       type="server_error", code="rate_limits_not_shared", retry=False)
    tenant = path[len(PREFIX):].strip("/")
    if not tenant:
        if method != "GET":
            raise method_not_allowed(method, "GET")
        return list_object([RateLimitObject.of(x) for x in await rates.store.limits()])
    if not TENANT_ID.match(tenant):
        raise ApiError(400, "tenant_id must be 1-64 letters, digits, '_', '.' or '-'.", code="invalid_tenant_id",
                       param="tenant_id")
    if method == "PUT":
        try:
            parsed = RateLimitBody.model_validate(json.loads(body or b"null"))
        except (ValueError, ValidationError) as exc:
            raise invalid_body(exc) from exc
        limit = await rates.store.set_limit(tenant, parsed.requests_per_s, verdict.key_id)
        rates.forget(tenant)
        return RateLimitObject.of(limit)
    if method == "DELETE":
        if not await rates.store.clear_limit(tenant):
            raise not_found(f"No rate limit override for tenant {tenant}.", code="rate_limit_not_found",
                            param="tenant_id")
        rates.forget(tenant)
        return RateLimitDeleted(id=tenant, deleted=True)
    raise method_not_allowed(method, "PUT, DELETE")


def invalid_body(exc: ValueError | ValidationError) -> ApiError:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or None
        return ApiError(400, f"{field or 'body'}: {first['msg']}", code="invalid_request", param=field)
    return ApiError(400, "The body is not JSON: send {\"requests_per_s\": N}.", code="invalid_request")


def method_not_allowed(method: str, allowed: str) -> ApiError:
    return ApiError(405, f"This route does not take {method} (it takes {allowed}).", code="method_not_allowed",
                    headers={"Allow": allowed})
