"""Console sessions: an API key exchanged for an opaque cookie, kept server-side in the gateway.

The browser holds only a random session id in an HttpOnly cookie; the key stays here, so the gateway
can ask the key service about it on every request (a key revoked mid-session stops working within the
verifier's cache time). Sessions are stored under the sha256 of their id, expire after an idle time and
a maximum age, and are revoked by signing out. They live in this process's memory: a restarted gateway
signs everyone out, and replicas behind one load balancer need session affinity.

CSRF: every state-changing request authenticated by the cookie must carry the session's token twice,
in the `whet_csrf` cookie (readable by the console's script) and in the `X-CSRF-Token` header; the
token must also be the one this session was given. A request with `Authorization: Bearer` is not
cookie-authenticated and never needs it."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

SESSION_COOKIE = "whet_session"
CSRF_COOKIE = "whet_csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass
class Session:
    digest: str                 # sha256 of the session id (the id itself is never stored)
    key: str                    # the API key it stands for (server-side only)
    key_id: str
    tenant_id: str
    scopes: tuple[str, ...]
    csrf: str
    created: float
    last_seen: float = field(default=0.0)


def digest_of(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def parse_cookies(header: str | None) -> dict[str, str]:
    """`a=1; b=2` -> {a: 1, b: 2}; the first of two cookies with one name wins (as browsers order them)."""
    out: dict[str, str] = {}
    for part in (header or "").split(";"):
        name, sep, value = part.strip().partition("=")
        if sep and name and name not in out:
            out[name] = value.strip().strip('"')
    return out


class SessionStore:
    def __init__(self, *, idle_s: float = 8 * 3600, max_age_s: float = 24 * 3600, max_sessions: int = 50_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s, self.max_age_s, self.max_sessions, self.clock = idle_s, max_age_s, max_sessions, clock
        self.sessions: dict[str, Session] = {}

    def create(self, key: str, key_id: str, tenant_id: str, scopes: tuple[str, ...]) -> tuple[str, Session]:
        """A new session; returns its id (shown once, as the cookie) and the session."""
        if len(self.sessions) >= self.max_sessions:
            self.sweep()
            if len(self.sessions) >= self.max_sessions:   # still full: the oldest go first
                for digest in sorted(self.sessions, key=lambda d: self.sessions[d].last_seen)[:self.max_sessions // 10]:
                    del self.sessions[digest]
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        session = Session(digest_of(session_id), key, key_id, tenant_id, tuple(scopes), secrets.token_urlsafe(32),
                          created=now, last_seen=now)
        self.sessions[session.digest] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id or len(session_id) > 128:
            return None
        digest = digest_of(session_id)
        session = self.sessions.get(digest)
        if session is None:
            return None
        now = self.clock()
        if now - session.last_seen > self.idle_s or now - session.created > self.max_age_s:
            del self.sessions[digest]
            return None
        session.last_seen = now
        return session

    def from_headers(self, headers: Mapping[str, str]) -> Session | None:
        return self.get(parse_cookies(headers.get("cookie")).get(SESSION_COOKIE))

    def revoke(self, session: Session) -> None:
        self.sessions.pop(session.digest, None)

    def revoke_key(self, key_id: str) -> int:
        """Every session of one key (the key was found revoked)."""
        gone = [d for d, s in self.sessions.items() if s.key_id == key_id]
        for digest in gone:
            del self.sessions[digest]
        return len(gone)

    def sweep(self) -> None:
        now = self.clock()
        self.sessions = {d: s for d, s in self.sessions.items()
                         if now - s.last_seen <= self.idle_s and now - s.created <= self.max_age_s}


def csrf_problem(method: str, headers: Mapping[str, str], session: Session) -> str | None:
    """Why a cookie-authenticated request may not change state, or None when it may."""
    if method.upper() in SAFE_METHODS:
        return None
    sent = headers.get(CSRF_HEADER, "")
    if not sent:
        return "missing the X-CSRF-Token header"
    cookie = parse_cookies(headers.get("cookie")).get(CSRF_COOKIE, "")
    if not (hmac.compare_digest(sent.encode(), cookie.encode())
            and hmac.compare_digest(sent.encode(), session.csrf.encode())):
        return "the X-CSRF-Token header does not match this session's token"
    origin = headers.get("origin")
    if origin and origin.split("://", 1)[-1] != headers.get("host", ""):   # "null" (a sandboxed frame) too
        return f"cross-origin request from {origin[:100]}"
    return None
