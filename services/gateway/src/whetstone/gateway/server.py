"""Run the gateway in the current event loop (standalone, or beside the services in `whet dev`)."""

from __future__ import annotations

import asyncio

from whetstone.runtime.db import create_pool, migrate
from whetstone.runtime.http import HttpServer
from whetstone.runtime.lifecycle import freeze_startup_objects
from whetstone.runtime.logging import configure_logging, get_logger

from .app import Gateway
from .config import GatewaySettings
from .shared_limits import MIGRATIONS, SCHEMA, SharedTenantRates, TenantLimitStore

log = get_logger("whetstone.gateway")


class RunningGateway:
    def __init__(self, gateway: Gateway, server: HttpServer) -> None:
        self.gateway, self.server = gateway, server

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.server.stop()
        await self.gateway.close()


async def start_gateway(settings: GatewaySettings | None = None, upstreams: dict[str, str] | None = None,
                        port: int | None = None, database_url: str | None = None) -> RunningGateway:
    """`database_url`: the tenant rates are shared with every replica on the same database, and the
    operator's overrides are read there (shared_limits.py); None: each replica keeps 1/replicas in memory."""
    settings = settings or GatewaySettings()
    gateway = Gateway(settings, upstreams)
    if database_url:
        pool = await create_pool(database_url, SCHEMA, min_size=1, max_size=settings.database_pool_size)
        await migrate(pool, SCHEMA, MIGRATIONS)
        gateway.rates = SharedTenantRates(TenantLimitStore(pool), settings, gateway.fair.rate_refusal)
    server = HttpServer(gateway, settings.host, settings.http_port if port is None else port)
    # clients keep connections open longer than uvicorn's 5 s default (httpx: 5 s, browsers: more); a server
    # that closes first races the client's next request into a reset: the edge waits longer than they do
    server.server.config.timeout_keep_alive = settings.keep_alive_s
    await server.start()
    log.info("gateway started", port=server.port, upstreams=gateway.upstreams)
    return RunningGateway(gateway, server)


async def serve_forever(settings: GatewaySettings | None = None, database_url: str | None = None) -> None:
    running = await start_gateway(settings, database_url=database_url)
    freeze_startup_objects()   # a process of its own: nothing of a caller's is frozen with it
    try:
        await asyncio.Event().wait()
    finally:
        await running.stop()


def main() -> None:
    from whetstone.runtime.settings import CommonSettings, load_stack_env  # noqa: PLC0415

    load_stack_env(CommonSettings().data_dir)   # next to `whet stack up`, as the services
    common = CommonSettings()
    configure_logging(common.log_level, common.log_json)
    try:
        asyncio.run(serve_forever(database_url=common.database_url))
    except KeyboardInterrupt:
        pass
