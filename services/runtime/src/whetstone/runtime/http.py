"""Per-service HTTP: /healthz, /metrics, plus the service's own routes, behind a request-body cap;
the answers every API shares (OpenAI's list object, 404 and operator-only errors)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar, runtime_checkable

import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import ApiError, install_error_handlers
from .identity import Caller
from .observability import safe_exposition

HealthCheck = Callable[[], Awaitable[None]]
M = TypeVar("M", bound=MetricWrapperBase)

T = TypeVar("T")


@runtime_checkable
class HasId(Protocol):
    @property
    def id(self) -> str: ...


class ListObject(BaseModel, Generic[T]):
    """OpenAI's list object: `{"object": "list", "data": [...], "has_more": ...}` (job events, keys)."""

    object: Literal["list"] = "list"
    data: list[T]
    has_more: bool


class ListPage(ListObject[T], Generic[T]):
    """A list paged by id (`?after=<id>`), with the ids of the page's ends as OpenAI's cursor pages
    carry them (null on an empty page). Routes declare `ListPage[Item]` as their response model."""

    first_id: str | None
    last_id: str | None


def _id_of(item: object) -> str:
    if isinstance(item, Mapping):
        return str(item["id"])
    if isinstance(item, HasId):
        return item.id
    raise TypeError(f"a list item ({type(item).__name__}) has no id")


def list_page(data: Sequence[T], has_more: bool) -> ListPage[T]:
    """One page of a list route paged by id: first_id/last_id are the ids of data's ends."""
    return ListPage[T](data=list(data), has_more=has_more, first_id=_id_of(data[0]) if data else None,
                       last_id=_id_of(data[-1]) if data else None)


def list_object(data: Sequence[T], has_more: bool = False) -> ListObject[T]:
    return ListObject[T](data=list(data), has_more=has_more)


def not_found(message: str, *, code: str, param: str | None = None) -> ApiError:
    """404 in OpenAI's shape; `code` names what is missing (`file_not_found`, `model_not_found`, ...)."""
    return ApiError(404, message, code=code, param=param)


def operator_only(caller: Caller) -> None:
    """Routes that span tenants (or decide a charge) answer the platform's operator only: 403 otherwise."""
    if not caller.operator:
        raise ApiError(403, "Only the platform's operator may use this route.", type="permission_error",
                       code="operator_only")


class ServiceMetrics:
    """Metrics every service exposes; a registry of its own so six services fit one process."""

    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        self.service = service
        ns = "whetstone"

        def labelled(metric: M) -> Callable[..., M]:
            # every series carries the service name, even with six services in one process
            return lambda **labels: metric.labels(service=service, **labels)

        self.consumed = labelled(Counter(f"{ns}_messages_consumed_total", "Messages handled, by outcome",
                                         ["service", "topic", "outcome"], registry=self.registry))
        self.handler_seconds = labelled(Histogram(f"{ns}_handler_seconds", "Handler latency", ["service", "topic"],
                                                  registry=self.registry))
        self.dead_lettered = labelled(Counter(f"{ns}_dead_lettered_total", "Messages sent to a DLQ",
                                              ["service", "topic"], registry=self.registry))
        self.outbox_published = Counter(f"{ns}_outbox_published_total", "Outbox rows published", ["service"],
                                        registry=self.registry).labels(service=service)
        self.refused = labelled(Counter(f"{ns}_refused_total", "Messages or requests refused, by reason",
                                        ["service", "reason"], registry=self.registry))
        self.up = Gauge(f"{ns}_service_up", "1 while the service runs", ["service"], registry=self.registry)
        self.up.labels(service=service).set(1)


DEFAULT_MAX_BODY = 1 << 20
DRAIN_AFTER_REFUSAL = 1 << 20
DRAIN_SECONDS = 1.0


def too_large_body(limit: int) -> bytes:
    return json.dumps(ApiError(413, f"The request body is larger than this route accepts ({limit} bytes).",
                               code="request_too_large").body()).encode()


async def drain(receive: Receive, message: Message) -> None:
    """Read (and drop) up to DRAIN_AFTER_REFUSAL more bytes of a refused body, for at most
    DRAIN_SECONDS: a client still sending then reads the 413 instead of a reset, and one that
    stops sending holds nothing."""
    drained = 0
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            while message.get("more_body") and drained < DRAIN_AFTER_REFUSAL:
                message = await receive()
                drained += len(message.get("body", b""))
    except TimeoutError:
        pass


@dataclass
class _BodyCount:
    """One request's body as BodyLimit watches it."""
    seen: int = 0               # bytes received so far
    refused: bool = False       # answered 413 here: the app's own answer is dropped
    started: bool = False       # the app began its answer: too late to answer 413


class BodyLimit:
    """ASGI: a request whose body is larger than `limit` bytes is answered 413 in OpenAI's shape.
    A Content-Length over the limit is refused before one byte is read; a body without one
    (chunked) is counted as it arrives and refused once past the limit (the app then sees the
    client gone). Paths in `exempt` (uploads that stream to disk under their own limit) pass.
    The bound keeps one request from holding the event loop parsing megabytes of JSON, and keeps
    every field a body can carry far below what the bus accepts."""

    def __init__(self, app: ASGIApp, limit: int = DEFAULT_MAX_BODY, exempt: Collection[str] = ()) -> None:
        self.app, self.limit, self.exempt = app, limit, frozenset(exempt)

    async def refuse(self, send: Send, status: int = 413, body: bytes | None = None) -> None:
        body = body if body is not None else too_large_body(self.limit)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), (b"x-should-retry", b"false")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None:
            if not length.isdigit():
                await self.refuse(send, 400, json.dumps(ApiError(400, "Content-Length is not a number.",
                                                                 code="invalid_request").body()).encode())
                return
            if int(length) > self.limit:
                await self.refuse(send)
                return
        state = _BodyCount()

        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                state.seen += len(message.get("body", b""))
                if state.seen > self.limit:
                    await drain(receive, message)   # a little more first, so a client still sending reads the 413
                    if not state.started:
                        state.refused = True
                        await self.refuse(send)
                    return {"type": "http.disconnect"}     # the app stops reading: its own answer is dropped
            return message

        async def guarded(message: Message) -> None:
            if state.refused:
                return
            state.started = True
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except Exception:
            if not state.refused:
                raise


class Health(BaseModel):
    service: str
    status: Literal["ok", "degraded"]
    checks: dict[str, Literal["ok", "unavailable"]]


def make_app(service: str, metrics: ServiceMetrics, checks: dict[str, HealthCheck], *, docs: bool = False) -> FastAPI:
    """`docs`: serve /docs and /openapi.json (development only; the documents stay buildable in
    process, `app.openapi()`, for tests and tools)."""
    app = FastAPI(title=f"whetstone-{service}", docs_url="/docs" if docs else None, redoc_url=None,
                  openapi_url="/openapi.json" if docs else None)
    install_error_handlers(app)  # every error in OpenAI's shape {"error": {message, type, param, code}}

    @app.get("/healthz")
    async def healthz(response: Response) -> Health:
        """Which dependency is down, never why: error texts name hosts, paths and credentials."""
        results: dict[str, Literal["ok", "unavailable"]] = {}
        for name, check in checks.items():
            try:
                await asyncio.wait_for(check(), timeout=3)
                results[name] = "ok"
            except Exception:
                results[name] = "unavailable"
        ok = all(v == "ok" for v in results.values())
        response.status_code = 200 if ok else 503
        return Health(service=service, status="ok" if ok else "degraded", checks=results)

    @app.get("/metrics")
    async def prom() -> Response:
        return Response(safe_exposition(metrics.registry, service), media_type=CONTENT_TYPE_LATEST)

    return app


class HttpServer:
    """uvicorn in the current event loop; port 0 picks a free port (see .port after start)."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="off", access_log=False))
        self.server.install_signal_handlers = lambda: None  # type: ignore[attr-defined]
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.02)

    @property
    def port(self) -> int:
        port: int = self.server.servers[0].sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task:
            await self.task
