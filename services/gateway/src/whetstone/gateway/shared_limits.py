"""Tenant request rates shared by every gateway replica, and the operator's overrides of them.

The gateway's own schema in PostgreSQL (`gateway`) holds one token bucket per tenant. A replica
takes tokens from it a few at a time (a lease: `shared_rate_lease_s` of the tenant's rate, at least
one) and spends them locally, so a tenant costs one round trip per lease, not one per request; a
lease half spent, or half way to its expiry while in use, is topped up (back to at most one
lease's worth) behind the request, so a tenant within its rate rarely waits for it. Tokens are
only ever taken, never given back: a lease not used within `shared_rate_lease_s` is dropped,
which can only make the sum smaller, so all replicas together never pass more than the tenant's
one bucket allows, and a replica holds at most one lease's worth (and one token) ahead. A replica that finds the bucket empty refuses the tenant locally until
the bucket has refilled one token (no round trip per refused request).

The rate of a tenant is the operator's override in `tenant_limits` (written only by the operator's
`PUT /v1/operator/rate_limits/{tenant_id}`, read by every replica and cached `limits_ttl_s`: read
again behind the requests once half that old, so a replica in use rarely waits for it; a lease
taken at another rate is dropped), else
the deployment's `tenant_rate_limits` / `tenant_rate_limit_per_s` settings. A tenant's own keys
cannot raise it: a key's own `rate_limit_per_s` is capped at its tenant's rate.

When the database cannot be reached the replica falls back to its in-memory bucket holding
1/replicas of the rate (fairness.Fairness.rate_refusal), and says so in its log."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from whetstone.runtime.delivery import unavailable_dependency
from whetstone.runtime.errors import ApiError
from whetstone.runtime.logging import get_logger

from .config import GatewaySettings
from .ratelimit import retry_after_header

SCHEMA = "gateway"
log = get_logger("whetstone.gateway.limits")

MIGRATIONS = [
    """
    CREATE TABLE IF NOT EXISTS tenant_buckets (
        tenant_id  text             PRIMARY KEY,
        tokens     double precision NOT NULL,
        updated_at timestamptz      NOT NULL
    );
    CREATE TABLE IF NOT EXISTS tenant_limits (
        tenant_id      text             PRIMARY KEY,
        requests_per_s double precision NOT NULL CHECK (requests_per_s > 0),
        set_by         text             NOT NULL,
        set_at         timestamptz      NOT NULL DEFAULT now()
    );
    -- up to p_want tokens of the tenant's bucket (refilled at p_rate, at most p_capacity), under the
    -- row's lock: (granted, tokens left)
    CREATE OR REPLACE FUNCTION take_tenant_tokens(p_tenant text, p_rate double precision,
                                                  p_capacity double precision, p_want int,
                                                  OUT o_granted int, OUT o_tokens double precision)
    LANGUAGE plpgsql AS $$
    DECLARE
        v_now   timestamptz;
        v_avail double precision;
    BEGIN
        INSERT INTO tenant_buckets (tenant_id, tokens, updated_at) VALUES (p_tenant, p_capacity, clock_timestamp())
            ON CONFLICT (tenant_id) DO NOTHING;
        PERFORM 1 FROM tenant_buckets WHERE tenant_id = p_tenant FOR UPDATE;
        v_now := clock_timestamp();
        SELECT least(p_capacity, b.tokens + greatest(0, extract(epoch FROM v_now - b.updated_at)) * p_rate)
            INTO v_avail FROM tenant_buckets b WHERE b.tenant_id = p_tenant;
        o_granted := least(p_want, floor(v_avail))::int;
        o_tokens := v_avail - o_granted;
        UPDATE tenant_buckets SET tokens = o_tokens, updated_at = v_now WHERE tenant_id = p_tenant;
    END $$;
    """,
]


@dataclass(frozen=True)
class TenantLimit:
    tenant_id: str
    requests_per_s: float
    set_by: str
    set_at: datetime


class TenantLimitStore:
    """The gateway schema's buckets and overrides (PostgreSQL)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def take(self, tenant_id: str, rate: float, capacity: float, want: int) -> tuple[int, float]:
        row = await self.pool.fetchrow("SELECT o_granted, o_tokens FROM take_tenant_tokens($1, $2, $3, $4)",
                                       tenant_id, rate, capacity, want)
        return int(row["o_granted"]), float(row["o_tokens"])

    async def limits(self) -> list[TenantLimit]:
        rows = await self.pool.fetch("SELECT tenant_id, requests_per_s, set_by, set_at FROM tenant_limits "
                                     "ORDER BY tenant_id")
        return [TenantLimit(r["tenant_id"], r["requests_per_s"], r["set_by"], r["set_at"]) for r in rows]

    async def set_limit(self, tenant_id: str, requests_per_s: float, set_by: str) -> TenantLimit:
        r = await self.pool.fetchrow(
            "INSERT INTO tenant_limits (tenant_id, requests_per_s, set_by, set_at) VALUES ($1, $2, $3, now()) "
            "ON CONFLICT (tenant_id) DO UPDATE SET requests_per_s = EXCLUDED.requests_per_s, "
            "set_by = EXCLUDED.set_by, set_at = EXCLUDED.set_at RETURNING tenant_id, requests_per_s, set_by, set_at",
            tenant_id, requests_per_s, set_by)
        return TenantLimit(r["tenant_id"], r["requests_per_s"], r["set_by"], r["set_at"])

    async def clear_limit(self, tenant_id: str) -> bool:
        return bool(await self.pool.fetchval(
            "WITH gone AS (DELETE FROM tenant_limits WHERE tenant_id = $1 RETURNING 1) SELECT count(*) FROM gone",
            tenant_id))


@dataclass
class Lease:
    """Tokens this replica took from a tenant's shared bucket and has not spent yet."""

    rate: float = 0.0          # the tenant's rate when it was taken: a lease of another rate is dropped
    tokens: int = 0
    expires: float = 0.0
    refused_until: float = 0.0
    topping_up: bool = False


class SharedTenantRates:
    """The tenant rate of `Fairness.rate_refusal`, shared by every replica through `TenantLimitStore`."""

    def __init__(self, store: TenantLimitStore, settings: GatewaySettings,
                 fallback: Callable[[str, float], ApiError | None], clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.s, self.fallback, self.clock = store, settings, fallback, clock
        self.leases: dict[str, Lease] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.overrides: dict[str, float] = {}
        self.read_at = -math.inf
        self.reading: asyncio.Lock = asyncio.Lock()
        self.background: set[asyncio.Future[None]] = set()   # lease top-ups in flight (kept referenced)

    async def rate(self, tenant_id: str) -> float:
        """The tenant's requests per second over all replicas: the operator's override, else the settings'.
        Overrides read more than `limits_ttl_s` ago are read again before the answer; past half that,
        behind it (a replica in use keeps them fresh without a request waiting)."""
        age = self.clock() - self.read_at
        if age > self.s.limits_ttl_s:
            await self._read_overrides(self.s.limits_ttl_s)
        elif age > self.s.limits_ttl_s / 2 and not self.reading.locked():
            self._behind(self._read_overrides(self.s.limits_ttl_s / 2))
        return self.overrides.get(tenant_id, self.s.tenant_rate_limits.get(tenant_id, self.s.tenant_rate_limit_per_s))

    async def _read_overrides(self, older_than: float) -> None:
        async with self.reading:
            if self.clock() - self.read_at > older_than:
                try:
                    self.overrides = {x.tenant_id: x.requests_per_s for x in await self.store.limits()}
                except Exception as exc:
                    if unavailable_dependency(exc) is None:
                        raise
                    log.warning("tenant limits unreadable; keeping the last ones read", error=str(exc))
                self.read_at = self.clock()

    def _behind(self, work: Awaitable[None]) -> None:
        """`work` in the background, kept referenced until done; its failure is the next request's."""
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Future[None]) -> None:
        self.background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a background read of the tenant rates failed", error=str(task.exception()))

    def forget(self, tenant_id: str) -> None:
        """An override changed on this replica: read again at the next request (others within limits_ttl_s)."""
        self.read_at = -math.inf
        self.leases.pop(tenant_id, None)

    async def refusal(self, tenant_id: str, rate: float) -> ApiError | None:
        """None when one more request of the tenant may pass; otherwise its 429. A lease half spent is
        topped up in the background, so a tenant within its rate rarely waits for the database."""
        now = self.clock()
        lease = self.leases.get(tenant_id)
        if lease is None or lease.rate != rate:
            if len(self.leases) >= 100_000:
                self.leases.clear()   # crude bound; an empty lease costs one round trip, never a wrong answer
            lease = self.leases[tenant_id] = Lease(rate=rate)
        want = max(1, math.floor(rate * self.s.shared_rate_lease_s))
        if lease.tokens > 0 and lease.expires > now:
            lease.tokens -= 1
            # topped up when half spent, or half way to its expiry (a tenant slower than a lease per
            # lease_s would otherwise find it expired, and wait, every lease). A lease of one token is
            # not topped up: at low rates a token taken ahead and not spent would be a good part of
            # the tenant's rate lost
            half_spent = lease.tokens <= want // 2
            expiring = lease.expires - now < self.s.shared_rate_lease_s / 2
            if want >= 2 and (half_spent or expiring) and not lease.topping_up:
                lease.topping_up = True
                self._behind(self._top_up(tenant_id, lease, rate, want))
            return None
        if lease.refused_until > now:
            return refusal(rate, lease.refused_until - now)
        async with self.locks.setdefault(tenant_id, asyncio.Lock()):   # concurrent requests share one round trip
            now = self.clock()
            if lease.tokens > 0 and lease.expires > now:
                lease.tokens -= 1
                return None
            if lease.refused_until > now:
                return refusal(rate, lease.refused_until - now)
            try:
                granted = await self._take(tenant_id, lease, rate, want)
            except Exception as exc:   # the database is away: this replica's share, in memory
                if unavailable_dependency(exc) is None:
                    raise
                log.warning("shared tenant rate unavailable; this replica's share decides", error=str(exc))
                return self.fallback(tenant_id, now)
            if not granted:
                return refusal(rate, lease.refused_until - now)
            lease.tokens -= 1
            return None

    async def _take(self, tenant_id: str, lease: Lease, rate: float, want: int) -> int:
        """Up to `want` tokens of the shared bucket into the lease (under the tenant's lock): how many came.
        None came: the lease refuses until the bucket has one again."""
        capacity = max(rate * self.s.rate_limit_burst_s, 1.0)
        held = lease.tokens if lease.expires > self.clock() else 0
        granted, left = await self.store.take(tenant_id, rate, capacity, max(1, want - held))   # one lease at most
        now = self.clock()
        if granted <= 0:
            lease.refused_until = now + (1.0 - left) / rate
            return 0
        lease.tokens = (lease.tokens if lease.expires > now else 0) + granted
        lease.expires = now + self.s.shared_rate_lease_s
        return granted

    async def _top_up(self, tenant_id: str, lease: Lease, rate: float, want: int) -> None:
        try:
            async with self.locks.setdefault(tenant_id, asyncio.Lock()):
                await self._take(tenant_id, lease, rate, want)
        except Exception as exc:   # the next request that finds the lease empty asks (and falls back) itself
            if unavailable_dependency(exc) is None:
                raise
        finally:
            lease.topping_up = False


def refusal(rate: float, wait: float) -> ApiError:
    return ApiError(429, f"Rate limit reached for this organization ({rate:g} requests/s over all its keys); "
                         f"retry after {wait:.2f}s.", type="rate_limit_error", code="rate_limit_exceeded",
                    retry=True, headers={"Retry-After": retry_after_header(wait),
                                         "x-ratelimit-limit-requests": f"{rate:g}/s"})
