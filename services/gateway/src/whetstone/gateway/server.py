"""Run the gateway in the current event loop (standalone, or beside the services in `whet dev`)."""

from __future__ import annotations

import asyncio

from whetstone.runtime.http import HttpServer
from whetstone.runtime.logging import configure_logging, get_logger

from .app import Gateway
from .config import GatewaySettings

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
                        port: int | None = None) -> RunningGateway:
    settings = settings or GatewaySettings()
    gateway = Gateway(settings, upstreams)
    server = HttpServer(gateway, settings.host, settings.http_port if port is None else port)
    # clients keep connections open longer than uvicorn's 5 s default (httpx: 5 s, browsers: more); a server
    # that closes first races the client's next request into a reset: the edge waits longer than they do
    server.server.config.timeout_keep_alive = settings.keep_alive_s
    await server.start()
    log.info("gateway started", port=server.port, upstreams=gateway.upstreams)
    return RunningGateway(gateway, server)


async def serve_forever(settings: GatewaySettings | None = None) -> None:
    running = await start_gateway(settings)
    try:
        await asyncio.Event().wait()
    finally:
        await running.stop()


def main() -> None:
    from whetstone.runtime.settings import CommonSettings  # noqa: PLC0415

    common = CommonSettings()
    configure_logging(common.log_level, common.log_json)
    try:
        asyncio.run(serve_forever())
    except KeyboardInterrupt:
        pass
