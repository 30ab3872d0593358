"""What an internal signature binds: the request it was made for, not only who sends it.

The gateway's identity signature and an internal call's signature are Ed25519 signatures (with the
key derived from the platform's internal secret, `identity.IdentityKeys`; services verify with its
public half) over one canonical text:

    <purpose>:v2 \n <signed value> \n <METHOD> \n <target> \n <content sha256>

- `target` is the request target as sent: the raw path (%-escapes kept) and `?<query>` if any;
- `content sha256` is the hex sha256 of the body, sent in `X-Whetstone-Content-Sha256`. A body the
  gateway streams (an upload over 1 MiB, or a chunked one) cannot be hashed before its headers go:
  it is signed as `UNSIGNED-PAYLOAD`, and a service accepts that marker only on a request whose body
  really is streamed (chunked, or a declared length over 1 MiB); the method, target, identity and
  time are still bound;
- the signed value carries a unix timestamp, accepted within `WINDOW_S` either side of the
  verifier's clock.

Replay: the window alone, no nonce. A nonce needs a store shared by every replica of every service
(a write per request); the window plus the binding leaves only an identical request (same method,
target, body and identity) repeatable for 60 s by someone who can read the internal network, and
the writes that matter are idempotent (job creation by Idempotency-Key).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Generator
from dataclasses import dataclass

import httpx
from fastapi import Request

CONTENT_HASH_HEADER = "X-Whetstone-Content-Sha256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
WINDOW_S = 60
STREAMED_MIN_BYTES = 1 << 20   # the gateway buffers (and hashes) bodies up to this size


@dataclass(frozen=True)
class Bound:
    """The parts of a request a signature covers besides the signed value itself."""

    method: str
    target: str
    content_sha256: str

    @classmethod
    def of(cls, method: str, target: str, body: bytes | None) -> Bound:
        """The binding of a request whose body is known (`None`: a streamed body, unsigned)."""
        return cls(method.upper(), target, UNSIGNED_PAYLOAD if body is None else hashlib.sha256(body).hexdigest())


def canonical(purpose: str, value: str, bound: Bound) -> bytes:
    """The text a signature covers."""
    return f"{purpose}:v2\n{value}\n{bound.method}\n{bound.target}\n{bound.content_sha256}".encode()


def within_window(ts: int, now: float) -> bool:
    return abs(now - ts) <= WINDOW_S


def target_of(scope_path: bytes | str, query: bytes | str) -> str:
    path = scope_path.decode("latin-1") if isinstance(scope_path, bytes) else scope_path
    q = query.decode("latin-1") if isinstance(query, bytes) else query
    return path + (f"?{q}" if q else "")


async def bound_of(request: Request) -> Bound | None:
    """The binding a request received by a service really has, or None when it cannot match any
    signature: its declared content hash differs from its body, or it claims an unsigned body that
    is not streamed."""
    scope = request.scope
    target = target_of(scope.get("raw_path") or scope["path"], scope.get("query_string", b""))
    declared = request.headers.get(CONTENT_HASH_HEADER, "")
    if declared == UNSIGNED_PAYLOAD:
        length = request.headers.get("content-length", "")
        streamed = "chunked" in request.headers.get("transfer-encoding", "").lower() or (
            length.isdigit() and int(length) > STREAMED_MIN_BYTES)
        return Bound(request.method, target, UNSIGNED_PAYLOAD) if streamed else None
    body = await request.body()   # cached by Starlette: the route reads the same bytes
    digest = hashlib.sha256(body).hexdigest()
    return Bound(request.method, target, digest) if hmac.compare_digest(digest, declared) else None


class SignedAuth(httpx.Auth):
    """httpx auth that signs every request as it is sent (method, target and body bound; a fresh
    timestamp each time, so a long-lived client never sends an expired signature)."""

    requires_request_body = True

    def headers_for(self, bound: Bound) -> dict[str, str]:
        raise NotImplementedError

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        bound = Bound.of(request.method, request.url.raw_path.decode("ascii"), request.content)
        request.headers.update(self.headers_for(bound))
        yield request
