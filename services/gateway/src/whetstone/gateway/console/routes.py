"""The console's own routes on the gateway: its static files at `/` and `/console/static/*`, and the
session (`POST /console/session` signs in with an API key, `GET` says who is signed in, `DELETE` signs
out). Everything else the console shows comes from the public `/v1` API through the normal proxy
path, authenticated by the session cookie (see `sessions.py`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from whetstone.runtime.errors import ApiError

from ..auth import KeysUnavailable
from .sessions import CSRF_COOKIE, SESSION_COOKIE, Session, csrf_problem

if TYPE_CHECKING:
    from ..app import Gateway

STATIC_DIR = Path(__file__).parent / "static"
CONTENT_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                 ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml"}
# No inline script or style, nothing from another origin: injected markup could not run even if it got in.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
                               "frame-ancestors 'none'",
    "x-content-type-options": "nosniff", "referrer-policy": "no-referrer", "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
}
SIGN_IN_PER_S = 2.0    # sign-in attempts per client address (a key guesser gets nowhere fast)


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WHETSTONE_CONSOLE_", extra="ignore")

    enabled: bool = True
    cookie_secure: Literal["auto", "always", "never"] = Field(
        default="auto", description="auto: Secure when the request came over TLS (https)")
    session_idle_s: float = Field(default=8 * 3600, gt=0)
    session_max_age_s: float = Field(default=24 * 3600, gt=0)
    reload_static: bool = Field(default=False, description="read the files again on every request (console work)")


def is_console_path(path: str) -> bool:
    return path == "/" or path == "/console" or path.startswith("/console/")


def load_static() -> dict[str, tuple[bytes, str]]:
    """Every file under static/, read once: `name` -> (bytes, content type). Only these names are served."""
    files = {}
    for path in sorted(STATIC_DIR.rglob("*")):
        if path.is_file() and path.suffix in CONTENT_TYPES:
            files[path.relative_to(STATIC_DIR).as_posix()] = (path.read_bytes(), CONTENT_TYPES[path.suffix])
    return files


class SignIn(BaseModel):
    api_key: str = Field(min_length=1, max_length=200)


def routes(gateway: Gateway, settings: ConsoleSettings) -> APIRouter:
    r = APIRouter()
    static = load_static()
    version = str(int(time.time()))

    def asset(name: str) -> Response:
        found = (load_static() if settings.reload_static else static).get(name)
        if found is None:
            raise ApiError(404, f"No console file {name!r}.", code="not_found")
        body, kind = found
        cache = "no-cache" if name == "index.html" else "private, max-age=300"
        return Response(body, media_type=kind, headers={**SECURITY_HEADERS, "cache-control": cache,
                                                         "etag": f'"{version}-{len(body)}"'})

    @r.get("/")
    @r.get("/console")
    async def index() -> Response:
        return asset("index.html")

    @r.get("/console/static/{name:path}")
    async def static_file(name: str) -> Response:
        return asset(name)

    def secure(request: Request) -> bool:
        return settings.cookie_secure == "always" or (settings.cookie_secure == "auto" and request.url.scheme == "https")

    def who(session: Session) -> dict:
        return {"object": "console.session", "tenant_id": session.tenant_id, "key_id": session.key_id,
                "scopes": list(session.scopes), "csrf_token": session.csrf}

    def same_origin(request: Request) -> None:
        origin = request.headers.get("origin")
        if origin and origin.split("://", 1)[-1] != request.headers.get("host", ""):
            raise ApiError(403, f"Cross-origin request from {origin[:100]} refused.", type="permission_error",
                           code="csrf_failed")

    @r.post("/console/session")
    async def sign_in(body: SignIn, request: Request) -> Response:
        same_origin(request)   # a JSON body cannot come from another site's form; its script is checked here
        client = request.client.host if request.client else "unknown"
        wait = gateway.limiter.take(f"console-sign-in:{client}", SIGN_IN_PER_S, time.monotonic())
        if wait > 0:
            raise ApiError(429, f"Too many sign-in attempts; retry after {wait:.1f}s.", type="rate_limit_error",
                           code="rate_limit_exceeded", retry=True, headers={"Retry-After": str(int(wait) + 1)})
        try:
            verdict = await gateway.keys.verify(body.api_key.strip())
        except KeysUnavailable as exc:
            raise ApiError(503, f"API keys cannot be verified right now ({exc}); retry shortly.",
                           type="server_error", code="service_unavailable", retry=True) from exc
        if verdict is None:
            raise ApiError(401, "Incorrect API key provided (unknown, malformed or revoked).", code="invalid_api_key")
        session_id, session = gateway.sessions.create(body.api_key.strip(), verdict.key_id, verdict.tenant_id,
                                                      verdict.scopes)
        response = JSONResponse(who(session), headers={"cache-control": "no-store"})
        flags = {"path": "/", "samesite": "strict", "secure": secure(request),
                 "max_age": int(settings.session_max_age_s)}
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True, **flags)
        response.set_cookie(CSRF_COOKIE, session.csrf, httponly=False, **flags)   # read by the console's script
        return response

    async def current(request: Request) -> Session:
        session = gateway.sessions.from_headers(request.headers)
        if session is None:
            raise ApiError(401, "Not signed in (no session, or it expired or was revoked).", code="not_signed_in")
        try:
            verdict = await gateway.keys.verify(session.key)
        except KeysUnavailable as exc:
            raise ApiError(503, f"API keys cannot be verified right now ({exc}); retry shortly.",
                           type="server_error", code="service_unavailable", retry=True) from exc
        if verdict is None or verdict.tenant_id != session.tenant_id:
            gateway.sessions.revoke_key(session.key_id)
            raise ApiError(401, "The API key of this session was revoked; sign in again.", code="invalid_api_key")
        session.scopes = verdict.scopes
        return session

    @r.get("/console/session")
    async def whoami(request: Request) -> JSONResponse:
        return JSONResponse(who(await current(request)), headers={"cache-control": "no-store"})

    @r.delete("/console/session")
    async def sign_out(request: Request) -> Response:
        session = gateway.sessions.from_headers(request.headers)
        if session is not None:
            problem = csrf_problem("DELETE", request.headers, session)
            if problem:
                raise ApiError(403, f"CSRF check failed: {problem}.", type="permission_error", code="csrf_failed")
            gateway.sessions.revoke(session)
        response = Response(status_code=204, headers={"cache-control": "no-store"})
        for name in (SESSION_COOKIE, CSRF_COOKIE):
            response.delete_cookie(name, path="/", samesite="strict", secure=secure(request),
                                   httponly=name == SESSION_COOKIE)
        return response

    return r
