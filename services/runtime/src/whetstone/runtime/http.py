"""Per-service HTTP: /healthz, /metrics, plus the service's own routes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import uvicorn
from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram

from .errors import install_error_handlers
from .observability import safe_exposition

HealthCheck = Callable[[], Awaitable[None]]


class ServiceMetrics:
    """Metrics every service exposes; a registry of its own so six services fit one process."""

    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry()
        self.service = service
        ns = "whetstone"

        def labelled(metric):  # every series carries the service name, even with six services in one process
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


def make_app(service: str, metrics: ServiceMetrics, checks: dict[str, HealthCheck]) -> FastAPI:
    app = FastAPI(title=f"whetstone-{service}")
    install_error_handlers(app)  # every error in OpenAI's shape {"error": {message, type, param, code}}

    @app.get("/healthz")
    async def healthz(response: Response) -> dict:
        results = {}
        for name, check in checks.items():
            try:
                await asyncio.wait_for(check(), timeout=3)
                results[name] = "ok"
            except Exception as exc:
                results[name] = f"error: {exc}"
        ok = all(v == "ok" for v in results.values())
        response.status_code = 200 if ok else 503
        return {"service": service, "status": "ok" if ok else "degraded", "checks": results}

    @app.get("/metrics")
    async def prom() -> Response:
        return Response(safe_exposition(metrics.registry, service), media_type=CONTENT_TYPE_LATEST)

    return app


class HttpServer:
    """uvicorn in the current event loop; port 0 picks a free port (see .port after start)."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    lifespan="off", access_log=False))
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            if self.task.done():
                self.task.result()
            await asyncio.sleep(0.02)

    @property
    def port(self) -> int:
        return self.server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.should_exit = True
        if self.task:
            await self.task
