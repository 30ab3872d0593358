"""Who is calling: the tenant identity that the public gateway vouches for.

The gateway (the only component that sees API keys) authenticates `Authorization: Bearer
<key>`, then forwards the request to the owning service with three headers:

    X-Whetstone-Identity: tenant=<id>;key=<key id>;scopes=<a,b>;ts=<unix seconds>
    X-Whetstone-Content-Sha256: hex(sha256(body)), or UNSIGNED-PAYLOAD for a streamed body
    X-Whetstone-Signature: hex(Ed25519 signature of identity + method + target + body hash)

(the canonical text is in `signing.py`). The signing key is derived from the platform's internal
secret (`IdentityKeys.from_secret`), held only by the gateway and the scheduler (and operators); every
other service verifies with its public half, `WHETSTONE_IDENTITY_PUBLIC_KEY`, and cannot sign. A
service trusts a tenant only when the signature verifies for THIS request (method, path and query,
body) and the timestamp is within 60 s; any other header a caller sends (`X-Tenant-Id`, a forged identity, a
signature made for another request) is refused with 401. Routes declare what they need with
`Depends(require("write"))`. Clients that call a service port directly (the CLI's operator calls,
tests) sign each request as it is sent with `IdentityAuth` / `InternalAuth` (httpx auth).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fastapi import Depends, Request

from .errors import ApiError
from .signing import CONTENT_HASH_HEADER, Bound, SignedAuth, bound_of, canonical, within_window

IDENTITY_HEADER = "X-Whetstone-Identity"
SIGNATURE_HEADER = "X-Whetstone-Signature"
# Platform-internal calls (the gateway asking the scheduler to verify a key, `whet keys` run by an
# operator who holds the internal secret): `<unix seconds>:<signature>`, the Ed25519 signature binding
# the timestamp to the request (`signing.canonical("internal", ts, ...)`).
INTERNAL_HEADER = "X-Whetstone-Internal"
# What the gateway never forwards from a caller: identity can only be added by the gateway itself.
UNTRUSTED_HEADERS = frozenset(h.lower() for h in (IDENTITY_HEADER, SIGNATURE_HEADER, INTERNAL_HEADER,
                                                  CONTENT_HASH_HEADER, "X-Tenant-Id"))
SCOPES = ("read", "write", "models:promote", "admin")
PLATFORM_TENANT = "platform"   # not a customer: the operator's identity for platform-wide routes


@dataclass(frozen=True)
class Caller:
    tenant_id: str
    key_id: str
    scopes: frozenset[str]
    platform: bool = False  # the internal secret itself (operators, the gateway): acts for any tenant

    @property
    def operator(self) -> bool:
        """The platform's operator: the internal secret, or an `admin` identity of the `platform` tenant
        (never a tenant's own key, whose `admin` reaches only its own tenant)."""
        return self.platform or (self.tenant_id == PLATFORM_TENANT and "admin" in self.scopes)

    def allows(self, scope: str) -> bool:
        if "admin" in self.scopes:
            return True
        if scope == "read":
            return bool(self.scopes & {"read", "write", "models:promote"})
        return scope in self.scopes


_SECRETS: dict[Path, bytes] = {}


def internal_secret(data_dir: Path | None = None) -> bytes:
    """WHETSTONE_INTERNAL_SECRET, else a random secret kept in <data_dir>/internal.secret so the
    services and the gateway of one machine agree (created on first use, mode 0600; read once)."""
    value = os.environ.get("WHETSTONE_INTERNAL_SECRET")
    if value:
        return value.encode()
    path = ((data_dir or Path(os.environ.get("WHETSTONE_DATA_DIR", ".whetstone"))) / "internal.secret").absolute()
    cached = _SECRETS.get(path)
    if cached is not None and path.exists():
        return cached
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another process created it first
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
    _SECRETS[path] = path.read_text().strip().encode()
    return _SECRETS[path]


def sign(identity: str, secret: bytes) -> str:
    return hmac.new(secret, identity.encode(), hashlib.sha256).hexdigest()


PUBLIC_KEY_ENV = "WHETSTONE_IDENTITY_PUBLIC_KEY"
_SIGNING_KEY_LABEL = b"whetstone-identity-signing-key:v1"


@dataclass(frozen=True)
class IdentityKeys:
    """The key pair that signs identities and internal calls. `private` is derived from the internal
    secret (the gateway, the scheduler, operators); a service given only `WHETSTONE_IDENTITY_PUBLIC_KEY`
    holds the public half: it verifies every call and can forge none."""

    public: Ed25519PublicKey
    private: Ed25519PrivateKey | None = None

    @classmethod
    def from_secret(cls, secret: bytes) -> IdentityKeys:
        return _keys_from_secret(secret)

    @classmethod
    def from_public_hex(cls, text: str) -> IdentityKeys:
        try:
            return cls(Ed25519PublicKey.from_public_bytes(bytes.fromhex(text.strip())))
        except ValueError as exc:
            raise ValueError(f"{PUBLIC_KEY_ENV} is not a hex Ed25519 public key (64 hex digits): {exc}") from exc

    def public_hex(self) -> str:
        return self.public.public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def sign(self, text: bytes) -> str:
        if self.private is None:
            raise PermissionError("this process holds only the identity public key: it cannot sign")
        return self.private.sign(text).hex()

    def verify(self, text: bytes, signature: str) -> bool:
        try:
            self.public.verify(bytes.fromhex(signature), text)
        except (InvalidSignature, ValueError):
            return False
        return True


@functools.lru_cache(maxsize=16)
def _keys_from_secret(secret: bytes) -> IdentityKeys:
    private = Ed25519PrivateKey.from_private_bytes(hmac.new(secret, _SIGNING_KEY_LABEL, hashlib.sha256).digest())
    return IdentityKeys(private.public_key(), private)


def identity_keys(data_dir: Path | None = None) -> IdentityKeys:
    """What a service verifies callers with: the public key in `WHETSTONE_IDENTITY_PUBLIC_KEY` when set
    (a service deployed without the internal secret never reads it), else the pair derived from the
    internal secret (the dev stack: every process of one machine shares `<data_dir>/internal.secret`)."""
    public = os.environ.get(PUBLIC_KEY_ENV, "").strip()
    if public:
        return IdentityKeys.from_public_hex(public)
    return IdentityKeys.from_secret(internal_secret(data_dir))


def _keys(keys: IdentityKeys | bytes | None) -> IdentityKeys:
    if isinstance(keys, IdentityKeys):
        return keys
    return IdentityKeys.from_secret(keys or internal_secret())


def identity_headers(tenant_id: str, scopes: tuple[str, ...] | frozenset[str] = ("read", "write"), *, bound: Bound,
                     key_id: str = "internal", secret: bytes | IdentityKeys | None = None,
                     now: float | None = None) -> dict[str, str]:
    """The headers the gateway adds after authenticating a key, for the request `bound` describes."""
    ts = int(now if now is not None else time.time())
    identity = f"tenant={tenant_id};key={key_id};scopes={','.join(sorted(scopes))};ts={ts}"
    return {IDENTITY_HEADER: identity, CONTENT_HASH_HEADER: bound.content_sha256,
            SIGNATURE_HEADER: _keys(secret).sign(canonical("identity", identity, bound))}


def internal_headers(bound: Bound, secret: bytes | IdentityKeys | None = None, *,
                     now: float | None = None) -> dict[str, str]:
    """Headers of a platform-internal call (the gateway, an operator's `whet keys`) for one request."""
    ts = str(int(now if now is not None else time.time()))
    return {INTERNAL_HEADER: f"{ts}:{_keys(secret).sign(canonical('internal', ts, bound))}",
            CONTENT_HASH_HEADER: bound.content_sha256}


class IdentityAuth(SignedAuth):
    """httpx auth: each request signed as the gateway would sign it for this tenant and scopes."""

    def __init__(self, tenant_id: str, scopes: tuple[str, ...] | frozenset[str] = ("read", "write"), *,
                 key_id: str = "internal", secret: bytes | None = None) -> None:
        self.tenant_id, self.scopes, self.key_id, self.secret = tenant_id, scopes, key_id, secret

    def headers_for(self, bound: Bound) -> dict[str, str]:
        return identity_headers(self.tenant_id, self.scopes, bound=bound, key_id=self.key_id, secret=self.secret)


class InternalAuth(SignedAuth):
    """httpx auth: each request signed with the internal secret (operators, the platform itself)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret

    def headers_for(self, bound: Bound) -> dict[str, str]:
        return internal_headers(bound, self.secret)


def verify_internal(value: str | None, keys: IdentityKeys | bytes, bound: Bound | None, *,
                    now: float | None = None) -> bool:
    ts, _, sent = (value or "").partition(":")
    if bound is None or not ts.isdigit() or not sent:
        return False
    if not within_window(int(ts), now if now is not None else time.time()):
        return False
    return _keys(keys).verify(canonical("internal", ts, bound), sent)


# Producer tokens: what an external producer of `job.requested` puts in the envelope's
# `producer_token` to prove which tenant it publishes for. `whp_<token id>.<tenant>.<expires>.<mac>`,
# where <expires> is the unix second the token stops being valid and the mac is
# hex(HMAC-SHA256(internal secret, "producer-token:v2:<token id>:<tenant>:<expires>"))[:32]: only the
# platform can mint one, and neither the tenant nor the expiry can be edited without breaking it.
# The scheduler also requires the token id to be one it issued and has not revoked (its `api_keys`
# table, read on every message): a signed token it has no record of is refused (fail closed).
PRODUCER_TOKEN_PREFIX = "whp_"
PRODUCER_TOKEN_TTL_S = 90 * 86400
PRODUCER_TOKEN_MAX_TTL_S = 366 * 86400
_PRODUCER_TOKEN = re.compile(r"whp_([0-9a-f]{16})\.([A-Za-z0-9_.:-]{1,128})\.([0-9]{1,12})\.([0-9a-f]{32})")


@dataclass(frozen=True)
class ProducerToken:
    token_id: str
    tenant_id: str
    expires_at: int   # unix seconds

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def _producer_mac(token_id: str, tenant_id: str, expires_at: int, secret: bytes) -> str:
    return sign(f"producer-token:v2:{token_id}:{tenant_id}:{expires_at}", secret)[:32]


def mint_producer_token(tenant_id: str, secret: bytes | None = None, *, token_id: str | None = None,
                        expires_at: int | None = None, now: float | None = None) -> str:
    """A producer token for `tenant_id`, valid until `expires_at` (default: 90 days from now). It is
    usable only once the scheduler has recorded its id (`KeyStore.create_producer` does both)."""
    token_id = token_id or secrets.token_hex(8)
    exp = expires_at if expires_at is not None else int((now if now is not None else time.time()) + PRODUCER_TOKEN_TTL_S)
    token = (f"{PRODUCER_TOKEN_PREFIX}{token_id}.{tenant_id}.{exp}."
             f"{_producer_mac(token_id, tenant_id, exp, secret or internal_secret())}")
    if not _PRODUCER_TOKEN.fullmatch(token):
        raise ValueError(f"cannot mint a producer token for tenant {tenant_id!r}")
    return token


def verify_producer_token(token: str, secret: bytes) -> ProducerToken | None:
    """The claims of a token the platform signed, or None (malformed or forged). Its expiry and
    whether it was issued and not revoked are the caller's to check."""
    m = _PRODUCER_TOKEN.fullmatch(token.strip())
    if m is None:
        return None
    token_id, tenant, exp, sent = m.groups()
    if not hmac.compare_digest(_producer_mac(token_id, tenant, int(exp), secret), sent):
        return None
    return ProducerToken(token_id, tenant, int(exp))


def _keys_of(request: Request) -> IdentityKeys:
    keys = getattr(request.app.state, "identity_keys", None)
    return keys if isinstance(keys, IdentityKeys) else identity_keys()


def _parse_identity(identity: str) -> tuple[int, Caller]:
    """`tenant=<id>;key=<key id>;scopes=<a,b>;ts=<unix seconds>` -> (ts, the caller); a name given twice
    counts as last written. ValueError when ts or tenant is missing or ts is not a number."""
    ts = tenant = None
    key = scopes = ""
    for part in identity.split(";"):
        name, _, value = part.partition("=")
        match name:
            case "ts":
                ts = value
            case "tenant":
                tenant = value
            case "key":
                key = value
            case "scopes":
                scopes = value
    if ts is None or tenant is None:
        raise ValueError("ts and tenant are required")
    return int(ts), Caller(tenant_id=tenant, key_id=key, scopes=frozenset(s for s in scopes.split(",") if s))


def verify(identity: str | None, signature: str | None, keys: IdentityKeys | bytes, bound: Bound | None, *,
           now: float | None = None) -> Caller:
    """The caller `identity` names, when `signature` is the platform's for it AND for the request
    `bound` describes (None: the request's body does not match its declared hash)."""
    if not identity or not signature:
        raise ApiError(401, "Missing or invalid API key: send `Authorization: Bearer <key>` to the public API.",
                       type="invalid_request_error", code="invalid_api_key")
    if bound is None or not _keys(keys).verify(canonical("identity", identity, bound), signature):
        raise ApiError(401, "The caller's identity could not be verified for this request.",
                       type="invalid_request_error", code="invalid_identity")
    try:
        ts, caller = _parse_identity(identity)
    except ValueError:
        raise ApiError(401, "Malformed identity header.", type="invalid_request_error", code="invalid_identity")
    if not within_window(ts, now if now is not None else time.time()):
        raise ApiError(401, "The caller's identity has expired.", type="invalid_request_error", code="invalid_identity")
    return caller


def _caller_with(scope: str) -> Callable[[Request], Awaitable[Caller]]:
    async def caller(request: Request) -> Caller:
        who = verify(request.headers.get(IDENTITY_HEADER), request.headers.get(SIGNATURE_HEADER), _keys_of(request),
                     await bound_of(request))
        if not who.allows(scope):
            raise ApiError(403, f"This API key lacks the `{scope}` scope.", type="invalid_request_error",
                           code="insufficient_scope")
        return who

    return caller


# The dependencies below are route parameters' defaults (`caller: Caller = require("read")`): FastAPI's
# Depends marker, typed Any so that it stands in for the Caller it resolves to.

def require(scope: str = "read") -> Any:
    """FastAPI dependency: the verified caller, holding `scope` (403 otherwise)."""
    return Depends(_caller_with(scope))


PLATFORM = Caller(tenant_id="*", key_id="internal", scopes=frozenset({"admin"}), platform=True)


def require_internal() -> Any:
    """FastAPI dependency: only a caller holding the internal secret (never a tenant's key)."""

    async def internal(request: Request) -> Caller:
        if not verify_internal(request.headers.get(INTERNAL_HEADER), _keys_of(request), await bound_of(request)):
            raise ApiError(401, "This route is internal to the platform.", code="invalid_internal_auth")
        return PLATFORM

    return Depends(internal)


def require_or_internal(scope: str) -> Any:
    """FastAPI dependency: the internal secret (PLATFORM, any tenant) or a verified caller with `scope`."""
    inner = _caller_with(scope)

    async def caller(request: Request) -> Caller:
        if request.headers.get(INTERNAL_HEADER) and verify_internal(request.headers.get(INTERNAL_HEADER),
                                                                    _keys_of(request), await bound_of(request)):
            return PLATFORM
        return await inner(request)

    return Depends(caller)
