"""Whose key is this? Asked of the scheduler (it owns keys), answers cached for at most 2 s; a
valid verdict used after its first quarter is refreshed in the background, so a key in use never
waits unless the key service takes longer than three quarters of the TTL to answer.

Both verdicts are cached (valid and invalid), keyed by the key's sha256 so the cache never holds
a usable key. Concurrent requests with the same key share one question.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from pydantic import BaseModel, ValidationError

from whetstone.runtime.identity import internal_headers
from whetstone.runtime.signing import Bound
from yarl import URL


class KeysUnavailable(Exception):
    """The key service could not answer (down, or an unexpected reply)."""


@dataclass(frozen=True)
class Verdict:
    key_id: str
    tenant_id: str
    scopes: tuple[str, ...]
    rate_limit_per_s: float | None


class VerifyAnswer(BaseModel):
    """The scheduler's `POST /internal/keys/verify` answer for a valid key."""

    key_id: str
    tenant_id: str
    scopes: list[str]
    rate_limit_per_s: float | None = None


class ErrorDetail(BaseModel):
    code: str | None = None


class ErrorAnswer(BaseModel):
    """An OpenAI-shaped error body (the part the gateway reads)."""

    error: ErrorDetail | None = None


class KeyVerifier:
    def __init__(self, session: Callable[[], aiohttp.ClientSession], verify_url: str | None, *, ttl_s: float = 2.0,
                 secret: bytes | None = None, clock: Callable[[], float] = time.monotonic,
                 max_entries: int = 100_000) -> None:
        self.session, self.verify_url, self.ttl_s, self.secret = session, verify_url, ttl_s, secret
        self.verify_target = URL(verify_url).raw_path_qs if verify_url else ""   # what the signature binds
        self.clock, self.max_entries = clock, max_entries
        self.cache: dict[str, tuple[float, Verdict | None]] = {}
        self.pending: dict[str, asyncio.Future] = {}   # the question in flight, per key digest
        self.refreshing: set[asyncio.Future] = set()   # background refreshes (kept referenced until done)

    async def verify(self, key: str) -> Verdict | None:
        digest = hashlib.sha256(key.encode()).hexdigest()
        now = self.clock()
        hit = self.cache.get(digest)
        if hit is not None and hit[0] > now:
            if hit[1] is not None and hit[0] - now < self.ttl_s * 0.75 and digest not in self.pending:
                # refreshed in the background while the verdict is still good: a busy key's requests never
                # wait for the key service (which other tenants' requests keep busy); a revoked key still
                # stops within ttl_s, since the old verdict is never used past its expiry
                task = self._lookup(key, digest, now)
                self.refreshing.add(task)
                task.add_done_callback(self._refreshed)
            return hit[1]
        waiting = self.pending.get(digest)
        if waiting is None:
            waiting = self._lookup(key, digest, now)
        return await asyncio.shield(waiting)

    def _refreshed(self, task: asyncio.Future) -> None:
        self.refreshing.discard(task)
        if not task.cancelled():
            task.exception()   # a failed refresh: the request after the verdict's expiry asks (and says why)

    def _lookup(self, key: str, digest: str, now: float) -> asyncio.Future:
        """One question for `digest`, registered as pending before this returns: every request of the
        key that comes while it is asked (a burst arrives within one turn of the loop) waits on it or
        is answered from the cache, and none asks again."""
        task = asyncio.ensure_future(self._answer(key, digest, now))
        self.pending[digest] = task
        task.add_done_callback(lambda done: self._settled(digest, done))
        return task

    def _settled(self, digest: str, task: asyncio.Future) -> None:
        if self.pending.get(digest) is task:
            del self.pending[digest]
        if not task.cancelled():
            task.exception()   # retrieved: no "never retrieved" warning when nobody else waited

    async def _answer(self, key: str, digest: str, now: float) -> Verdict | None:
        verdict = await self._ask(key)
        if len(self.cache) >= self.max_entries:
            self.cache = {k: v for k, v in self.cache.items() if v[0] > now}
            if len(self.cache) >= self.max_entries:
                self.cache.clear()
        self.cache[digest] = (self.clock() + self.ttl_s, verdict)
        return verdict

    async def _ask(self, key: str) -> Verdict | None:
        if not self.verify_url:
            raise KeysUnavailable("no key service (scheduler) configured")
        try:
            body = json.dumps({"key": key}).encode()
            signed = internal_headers(Bound.of("POST", self.verify_target, body), self.secret)
            async with self.session().post(self.verify_url, data=body,
                                           headers={"Content-Type": "application/json", **signed},
                                           timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                status, body = r.status, await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise KeysUnavailable(f"key service unreachable: {type(exc).__name__}") from exc
        try:
            if status == 401:
                error = ErrorAnswer.model_validate_json(body).error
                if error is not None and error.code == "invalid_api_key":
                    return None
            if status != 200:
                raise KeysUnavailable(f"key service answered {status}")
            answer = VerifyAnswer.model_validate_json(body)
        except ValidationError as exc:
            raise KeysUnavailable(f"key service answered {status} with an unexpected body") from exc
        return Verdict(key_id=answer.key_id, tenant_id=answer.tenant_id, scopes=tuple(answer.scopes),
                       rate_limit_per_s=answer.rate_limit_per_s)
