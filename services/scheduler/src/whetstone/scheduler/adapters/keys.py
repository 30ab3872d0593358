"""API keys: issued to a tenant, stored only as a hash, verified by the gateway, revocable.

A key reads `wsk-<key id>-<secret>`: the id (12 hex) finds the row, the secret (48 hex, 192 bits)
is compared with its stored sha256 in constant time. The secret is shown once, at creation.
A slow hash (bcrypt/argon2) buys nothing for a random 192-bit secret; sha256 is enough.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
import asyncpg
from whetstone.runtime.identity import SCOPES, mint_producer_token

KEY_FORMAT = re.compile(r"wsk-([0-9a-f]{12})-([0-9a-f]{48})")
# A producer token (whetstone.runtime.identity) is recorded here too, so `whet keys list|revoke` treat it
# like a key; its row holds this one scope and no usable secret, so it never verifies as an API key.
PRODUCER_SCOPE = "produce:job.requested"
LAST_USED_GRANULARITY = timedelta(seconds=60)  # at most one write per key per minute on verify
DEFAULT_SCOPES = ("read", "write")


class KeyError_(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


@dataclass(frozen=True)
class ApiKey:
    key_id: str
    tenant_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    rate_limit_per_s: float | None

    @property
    def producer(self) -> bool:
        """A producer token's record rather than an API key's."""
        return PRODUCER_SCOPE in self.scopes


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_scopes(scopes: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(scopes or DEFAULT_SCOPES))
    unknown = [s for s in chosen if s not in SCOPES]
    if unknown:
        raise KeyError_("invalid_scope", f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(SCOPES)}",
                        "scopes")
    return chosen


def _row(r: asyncpg.Record) -> ApiKey:
    return ApiKey(key_id=r["key_id"], tenant_id=r["tenant_id"], name=r["name"], scopes=tuple(r["scopes"]),
                  created_at=r["created_at"], last_used_at=r["last_used_at"], revoked_at=r["revoked_at"],
                  rate_limit_per_s=r["rate_limit_per_s"])


class KeyStore:
    """Postgres-backed key store (the scheduler's schema, table `api_keys`)."""

    def __init__(self, pool: asyncpg.Pool, clock=lambda: datetime.now(UTC)) -> None:
        self.pool, self.clock = pool, clock

    async def create(self, tenant_id: str, *, name: str = "", scopes: list[str] | None = None,
                     rate_limit_per_s: float | None = None) -> tuple[ApiKey, str]:
        """A new key for `tenant_id`; returns (the key's record, the full key: shown once)."""
        chosen = check_scopes(scopes)
        key_id, secret = secrets.token_hex(6), secrets.token_hex(24)
        row = await self.pool.fetchrow(
            "INSERT INTO api_keys (key_id, tenant_id, name, scopes, secret_hash, created_at, rate_limit_per_s)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *",
            key_id, tenant_id, name[:200], list(chosen), hash_secret(secret), self.clock(), rate_limit_per_s)
        return _row(row), f"wsk-{key_id}-{secret}"

    async def create_producer(self, tenant_id: str, secret: bytes, *, name: str = "",
                              expires_in_s: int | None = None) -> tuple[ApiKey, str]:
        """A producer token for `tenant_id`, valid for `expires_in_s` (default: the token's default
        lifetime); returns (its record, the token: shown once)."""
        token_id = secrets.token_hex(8)
        expires_at = int(self.clock().timestamp()) + expires_in_s if expires_in_s is not None else None
        token = mint_producer_token(tenant_id, secret, token_id=token_id, expires_at=expires_at,
                                    now=self.clock().timestamp())
        row = await self.pool.fetchrow(
            "INSERT INTO api_keys (key_id, tenant_id, name, scopes, secret_hash, created_at)"
            " VALUES ($1, $2, $3, $4, $5, $6) RETURNING *",
            token_id, tenant_id, name[:200], [PRODUCER_SCOPE], "producer:" + hash_secret(token), self.clock())
        return _row(row), token

    async def list(self, tenant_id: str | None = None, *, include_revoked: bool = True) -> list[ApiKey]:
        rows = await self.pool.fetch(
            "SELECT * FROM api_keys WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2 OR revoked_at IS NULL)"
            " ORDER BY created_at, key_id", tenant_id, include_revoked)
        return [_row(r) for r in rows]

    async def get(self, key_id: str) -> ApiKey | None:
        row = await self.pool.fetchrow("SELECT * FROM api_keys WHERE key_id = $1", key_id)
        return _row(row) if row else None

    async def revoke(self, key_id: str) -> ApiKey | None:
        row = await self.pool.fetchrow(
            "UPDATE api_keys SET revoked_at = coalesce(revoked_at, $2) WHERE key_id = $1 RETURNING *",
            key_id, self.clock())
        return _row(row) if row else None

    async def verify(self, key: str) -> ApiKey | None:
        """The active key `key` names, or None (malformed, unknown, wrong secret, revoked)."""
        m = KEY_FORMAT.fullmatch(key.strip())
        if not m:
            return None
        key_id, secret = m.groups()
        row = await self.pool.fetchrow("SELECT * FROM api_keys WHERE key_id = $1", key_id)
        if row is None or not hmac.compare_digest(row["secret_hash"], hash_secret(secret)):
            return None
        found = _row(row)
        if found.revoked_at:
            return None
        now = self.clock()
        if found.last_used_at is None or now - found.last_used_at > LAST_USED_GRANULARITY:
            await self.pool.execute("UPDATE api_keys SET last_used_at = $2 WHERE key_id = $1", key_id, now)
        return found


async def producer_token_status(conn: asyncpg.Connection, token_id: str) -> str:
    """`active`, `revoked`, or `unknown` (never issued here) for the producer token `token_id` (read in
    the handler's transaction, so a revocation applies to the next message)."""
    revoked = await conn.fetchval(
        "SELECT revoked_at IS NOT NULL FROM api_keys WHERE key_id = $1 AND $2 = ANY(scopes)", token_id, PRODUCER_SCOPE)
    return "unknown" if revoked is None else "revoked" if revoked else "active"
