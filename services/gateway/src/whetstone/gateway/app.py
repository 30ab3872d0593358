"""The public edge. For every request: find the owning service by path, authenticate the bearer
key, take a token from the key's bucket, drop whatever identity the caller sent, sign the verified
identity, and stream the request to the service and its answer back (uploads and SSE included:
a body is buffered only when it is small). Errors are OpenAI-shaped.

The proxy path is a plain ASGI callable over an aiohttp client session: on this path a framework's
routing and an httpx client cost more CPU than the service behind them."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

from whetstone.runtime.errors import ApiError, install_error_handlers
from whetstone.runtime.identity import UNTRUSTED_HEADERS, identity_headers, internal_secret
from whetstone.runtime.signing import Bound, target_of
from yarl import URL

from .auth import KeysUnavailable, KeyVerifier, Verdict
from .coalesce import Capture, Coalescer, send_answer
from .config import GatewaySettings
from .fairness import Fairness, until_gone, wants_stream
from .limits import BodyTooLarge, body_limit, counted, declared_too_large
from . import limits_api
from .console.gate import cookie_session
from .console.routes import ConsoleSettings, is_console_path
from .console.routes import routes as console_routes
from .console.sessions import SessionStore
from .ratelimit import RateLimiter, retry_after_header
from .routing import GATEWAY, bearer, owner_of
from .shared_limits import SharedTenantRates

# Hop-by-hop headers (RFC 9110 §7.6.1) belong to one connection, never forwarded.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "transfer-encoding", "upgrade", "host"})
# the console's session cookie and CSRF token stop at the edge, as a bearer key does
DROP_REQUEST = HOP_BY_HOP | UNTRUSTED_HEADERS | {"authorization", "expect", "cookie", "x-csrf-token"}
DROP_RESPONSE = HOP_BY_HOP | {"server", "date"}
OWN_ROUTES = ("/healthz", "/metrics")
# refusals the services answer themselves, counted with the edge's own in whetstone_refused_total
UPSTREAM_REFUSALS = {401: "identity_refused", 403: "forbidden"}
BUFFER_LIMIT = 1 << 20   # request bodies up to this size (JSON) are read whole; larger ones stream


@dataclass
class GatewayMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter("whetstone_gateway_requests_total", "Requests by owning service and status",
                                ["service", "status"], registry=self.registry)
        self.refused = Counter("whetstone_refused_total", "Requests refused at the edge, by reason",
                               ["service", "reason"], registry=self.registry)
        self.latency = Histogram("whetstone_gateway_upstream_seconds", "Time to the upstream's response headers",
                                 ["service"], registry=self.registry)
        self.coalesced = Counter("whetstone_gateway_coalesced_total", "Reads answered with an identical read's "
                                 "upstream answer (coalesce.py)", ["service"], registry=self.registry)


class Gateway:
    def __init__(self, settings: GatewaySettings, upstreams: dict[str, str] | None = None,
                 secret: bytes | None = None) -> None:
        self.settings = settings
        self.upstreams = {k: v.rstrip("/") for k, v in (upstreams or settings.resolved_upstreams()).items()}
        self.secret = secret or internal_secret()
        self._session: aiohttp.ClientSession | None = None
        verify_url = f"{self.upstreams['scheduler']}/internal/keys/verify" if "scheduler" in self.upstreams else None
        self.keys = KeyVerifier(self.session, verify_url, ttl_s=settings.key_cache_ttl_s, secret=self.secret)
        self.limiter = RateLimiter(burst_s=settings.rate_limit_burst_s)
        self.fair = Fairness(settings)   # in-flight, stream and tenant-rate budgets
        self.reads = Coalescer()         # identical reads waiting together share one upstream call
        self.rates: SharedTenantRates | None = None   # tenant rates shared by every replica (a database)
        self._streams: aiohttp.ClientSession | None = None
        self.metrics = GatewayMetrics()
        self.console = ConsoleSettings()
        self.sessions = SessionStore(idle_s=self.console.session_idle_s, max_age_s=self.console.session_max_age_s)
        self.own_app = make_own_app(self)   # /healthz and /metrics

    def upstream_client(self, connections: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=connections, ttl_dns_cache=300,
                                         keepalive_timeout=self.settings.upstream_keep_alive_s)
        timeout = aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=self.settings.upstream_timeout_s)
        return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                     skip_auto_headers=("User-Agent",))

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self.upstream_client(self.settings.max_connections)
        return self._session

    def stream_session(self) -> aiohttp.ClientSession:
        """Long streams (SSE) ride a pool of their own: however many are open, ordinary requests
        keep all of `max_connections`."""
        if self._streams is None or self._streams.closed:
            self._streams = self.upstream_client(self.settings.max_stream_connections)
        return self._streams

    async def close(self) -> None:
        for client in (self._session, self._streams):
            if client is not None:
                await client.close()
        if self.rates is not None:
            await self.rates.store.pool.close()

    # -- the decision: who may go where -------------------------------------------------------
    async def admit(self, method: str, path: str, headers: dict[str, str]) -> tuple[str, str, Verdict] | ApiError:
        """(service, upstream base, verdict) or the refusal (counted by reason)."""
        service = owner_of(path)
        if service is None:
            return self.refused("none", "unknown_route", ApiError(
                404, f"Unknown request URL: {method} {path}.", code="unknown_url"))
        key = bearer(headers.get("authorization"))
        session, csrf_refusal = cookie_session(self.sessions, method, headers)   # the console, signed in
        if csrf_refusal is not None:
            return self.refused(service, "csrf", csrf_refusal)
        if session is not None:
            key = session.key
        if key is None:
            return self.refused(service, "missing_key", ApiError(
                401, "You didn't provide an API key. Send `Authorization: Bearer <key>` (create one with "
                     "`whet keys create TENANT`).", code="invalid_api_key"))
        try:
            verdict = await self.keys.verify(key)
        except KeysUnavailable as exc:
            return self.refused(service, "keys_unavailable", ApiError(
                503, f"API keys cannot be verified right now ({exc}); retry shortly.", type="server_error",
                code="service_unavailable", retry=True))
        if verdict is None:
            if session is not None:   # its key was revoked: so is every session of that key
                self.sessions.revoke_key(session.key_id)
            return self.refused(service, "invalid_key", ApiError(
                401, "Incorrect API key provided (unknown, malformed or revoked).", code="invalid_api_key"))
        tenant_rate = await self.tenant_rate(verdict.tenant_id)
        # a key's own rate only lowers it: no key of a tenant goes faster than the operator lets the tenant
        rate = min(verdict.rate_limit_per_s or self.settings.rate_limit_per_s, tenant_rate)
        wait = self.limiter.take(verdict.key_id, rate, time.monotonic())
        if wait > 0:
            return self.refused(service, "rate_limited", ApiError(
                429, f"Rate limit reached for this API key ({rate:g} requests/s); retry after {wait:.2f}s.",
                type="rate_limit_error", code="rate_limit_exceeded", retry=True,
                headers={"Retry-After": retry_after_header(wait), "x-ratelimit-limit-requests": f"{rate:g}/s"}))
        tenant_refusal = (await self.rates.refusal(verdict.tenant_id, tenant_rate) if self.rates is not None
                          else self.fair.rate_refusal(verdict.tenant_id, time.monotonic()))
        if tenant_refusal is not None:
            return self.refused(service, "tenant_rate_limited", tenant_refusal)
        if service == GATEWAY:
            return service, "", verdict
        base = self.upstreams.get(service)
        if base is None:
            return self.refused(service, "no_upstream", ApiError(
                503, f"The {service} service is not available on this deployment.", type="server_error",
                code="service_unavailable", retry=False))
        return service, base, verdict

    async def tenant_rate(self, tenant_id: str) -> float:
        """The tenant's requests per second over all replicas (the operator's override first)."""
        if self.rates is not None:
            return await self.rates.rate(tenant_id)
        return self.settings.tenant_rate_limits.get(tenant_id, self.settings.tenant_rate_limit_per_s)

    def refused(self, service: str, reason: str, exc: ApiError) -> ApiError:
        self.metrics.refused.labels(service=service, reason=reason).inc()
        self.metrics.requests.labels(service=service, status=str(exc.status)).inc()
        return exc

    # -- ASGI ----------------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in OWN_ROUTES or (
                self.console.enabled and is_console_path(scope["path"])):
            await self.own_app(scope, receive, send)
            return
        raw = scope["headers"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        admitted = await self.admit(scope["method"], scope["path"], headers)
        if isinstance(admitted, ApiError):
            await send_error(send, admitted)
            return
        service, base, verdict = admitted
        limit = body_limit(self.settings, scope["path"])
        if (refusal := declared_too_large(headers, limit)) is not None:
            await send_error(send, self.refused(service, "body_too_large", refusal))
            return
        if service == GATEWAY:
            await self.own_route(scope, counted(receive, limit), send, verdict)
            return
        await self.forward(scope, counted(receive, limit), send, raw, headers, service, base, verdict)

    async def forward(self, scope: dict, receive, send, raw: list, headers: dict[str, str], service: str, base: str,
                      verdict: Verdict) -> None:
        out = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in raw
               if k.decode("latin-1").lower() not in DROP_REQUEST]
        # the request target as sent (%-escapes kept): what the service receives and the signature binds
        target = target_of(scope.get("raw_path") or scope["path"], scope.get("query_string", b""))
        url = URL(base + target, encoded=True)
        length = headers.get("content-length")
        data: Any = None
        chunked = "transfer-encoding" in headers
        if scope["path"] in self.settings.upload_paths and (
                chunked or (length and length.isdigit() and int(length) > BUFFER_LIMIT)):
            data = request_body(receive)             # an upload: streamed, chunk by chunk
        elif chunked or (length and length != "0"):  # at most max_body_bytes (counted): read whole
            try:
                data = b"".join([chunk async for chunk in request_body(receive)])
            except ClientGone:
                return                               # the caller left before sending its body: nothing to do
            except BodyTooLarge as exc:
                await send_error(send, self.refused(service, "body_too_large", exc.error()))
                return
        # signed for this method, target and body (a streamed upload: UNSIGNED-PAYLOAD, see runtime.signing)
        bound = Bound.of(scope["method"], target, None if isinstance(data, AsyncIterator) else (data or b""))
        out += list(identity_headers(verdict.tenant_id, verdict.scopes, bound=bound, key_id=verdict.key_id,
                                     secret=self.secret).items())
        stream = wants_stream(scope["path"], scope.get("query_string", b""), headers,
                              data if isinstance(data, bytes) else None)
        if scope["method"] == "GET" and data is None and not stream:   # identical reads share a call (coalesce.py)
            read = (verdict.key_id, target, headers.get("accept", ""))
            group, leads = self.reads.join_or_lead(read)
            if not leads:
                with self.fair.pending(verdict.tenant_id, service):   # still the tenant's demand
                    answer = await group.answer
                if answer is not None:
                    self.metrics.coalesced.labels(service=service).inc()
                    self.metrics.requests.labels(service=service, status=str(answer.status)).inc()
                    await send_answer(send, answer)
                    return
                group = None                                 # not shareable: this read goes on alone
            capture = Capture()
            try:
                await self.admitted(scope, receive, capture.wrap(send), url, out, data, service, verdict, stream,
                                    entered=lambda: self.reads.close(read, group) if group is not None else None)
            finally:
                if group is not None:
                    self.reads.close(read, group)
                    group.finish(capture.answer())
            return
        await self.admitted(scope, receive, send, url, out, data, service, verdict, stream)

    async def admitted(self, scope: dict, receive, send, url: URL, out: list, data: Any, service: str,
                       verdict: Verdict, stream: bool, entered: Callable[[], None] = lambda: None) -> None:
        """The request with its place in the fair budgets (fairness.py), relayed; `entered` once it has one."""
        ticket = await self.fair.enter(verdict.key_id, verdict.tenant_id, stream, service)   # before any upstream work
        entered()
        if isinstance(ticket, ApiError):
            await send_error(send, self.refused(service, "stream_limit" if stream else "concurrency_limit", ticket))
            return
        try:
            relay = self.relay(scope["method"], url, out, data, send, service, stream)
            await (until_gone(relay, receive) if stream and not isinstance(data, AsyncIterator) else relay)
        finally:
            ticket.release()

    async def own_route(self, scope: dict, receive, send, verdict: Verdict) -> None:
        """A route the gateway answers itself (the operator's tenant rate limits, limits_api.py)."""
        try:
            body = b"".join([chunk async for chunk in request_body(receive)])
            answer = await limits_api.answer(self.rates, scope["method"], scope["path"], body, verdict)
        except ClientGone:
            return
        except BodyTooLarge as exc:
            await send_error(send, self.refused(GATEWAY, "body_too_large", exc.error()))
            return
        except ApiError as exc:
            await send_error(send, self.refused(GATEWAY, exc.code or "refused", exc) if exc.status in (401, 403)
                             else exc)
            return
        self.metrics.requests.labels(service=GATEWAY, status="200").inc()
        payload = answer.model_dump_json().encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload, "more_body": False})

    async def relay(self, method: str, url: URL, out: list, data: Any, send, service: str, stream: bool) -> None:
        """The request to the service, and its answer back as it arrives."""
        client = self.stream_session() if stream else self.session()
        began = time.perf_counter()
        try:
            resp = await client.request(method, url, headers=out, data=data, allow_redirects=False)
        except ClientGone:
            return                                   # the caller left mid-upload: the upstream saw it end early
        except BodyTooLarge as exc:                  # streamed past the cap: the upstream saw it end early
            await send_error(send, self.refused(service, "body_too_large", exc.error()))
            return
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            await send_error(send, self.refused(service, "upstream_unreachable", ApiError(
                502, f"The {service} service did not answer ({type(exc).__name__}); retry shortly.",
                type="server_error", code="upstream_unavailable", retry=True)))
            return
        try:
            self.metrics.latency.labels(service=service).observe(time.perf_counter() - began)
            self.metrics.requests.labels(service=service, status=str(resp.status)).inc()
            if resp.status in UPSTREAM_REFUSALS:   # the service refused the verified caller (scope, operator only)
                self.metrics.refused.labels(service=service, reason=UPSTREAM_REFUSALS[resp.status]).inc()
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(k, v) for k, v in resp.raw_headers if k.decode("latin-1").lower()
                                    not in DROP_RESPONSE]})
            async for chunk in resp.content.iter_any():     # as it arrives: SSE and downloads stream
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            resp.release()

    async def health(self) -> tuple[int, dict]:
        """Which upstream answers, never why one does not (a status or an error's name is the operator's,
        in the services' own logs and metrics: this route is public)."""
        async def probe(name: str, base: str) -> tuple[str, str]:
            try:
                async with self.session().get(f"{base}/healthz", timeout=aiohttp.ClientTimeout(total=3)) as r:
                    return name, "ok" if r.status == 200 else "unavailable"
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return name, "unavailable"

        results = dict(await asyncio.gather(*(probe(n, b) for n, b in sorted(self.upstreams.items()))))
        ok = results.get("scheduler") == "ok"  # without the key service nothing can be authenticated
        return (200 if ok else 503), {"service": "gateway", "status": "ok" if ok else "degraded",
                                      "upstreams": results}


class ClientGone(Exception):
    """The caller disconnected before its request body was complete."""


async def request_body(receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("client went away mid-request")
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body"):
            return


async def send_error(send, exc: ApiError) -> None:
    body = json.dumps(exc.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def make_own_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="whetstone", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    if gateway.console.enabled:
        app.include_router(console_routes(gateway, gateway.console))

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        status, body = await gateway.health()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
