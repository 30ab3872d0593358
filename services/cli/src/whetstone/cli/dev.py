"""All services in one process plus the public gateway on one port (`whet dev`, the demo)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def core_service_builders() -> list[Callable[[], Any]]:
    """The six services every fine-tune needs."""
    from whetstone.eval.bootstrap import build_service as eval_svc  # noqa: PLC0415
    from whetstone.ingest.bootstrap import build_service as ingest_svc  # noqa: PLC0415
    from whetstone.metering.bootstrap import build_service as metering_svc  # noqa: PLC0415
    from whetstone.registry.bootstrap import build_service as registry_svc  # noqa: PLC0415
    from whetstone.scheduler.bootstrap import build_service as scheduler_svc  # noqa: PLC0415
    from whetstone.trainer_agent.bootstrap import build_service as trainer_svc  # noqa: PLC0415

    return [ingest_svc, scheduler_svc, trainer_svc, eval_svc, registry_svc, metering_svc]


def optional_service_builders() -> list[Callable[[], Any]]:
    """Services the platform runs when they can start (serving needs its base model in the catalog);
    without them the gateway answers their routes with 503."""
    try:
        from whetstone.serving.bootstrap import build_service as serving_svc  # noqa: PLC0415
    except ImportError:
        return []
    return [serving_svc]


def all_service_builders() -> list[Callable[[], Any]]:
    return core_service_builders() + optional_service_builders()


def build_services(required: list[Callable[[], Any]], optional: list[Callable[[], Any]]) -> list[Any]:
    services = [b() for b in required]
    for build in optional:
        try:
            services.append(build())
        except Exception as exc:  # noqa: BLE001 - an optional service never stops the platform
            name = getattr(build, "__module__", "service").split(".")[1]
            print(f"[dev] {name} not started ({type(exc).__name__}: {exc}); its routes answer 503", flush=True)
    return services


def upstreams_of(runtimes) -> dict[str, str]:
    return {rt.name: f"http://127.0.0.1:{rt.http.port}" for rt in runtimes if rt.http is not None}


async def run_platform(settings=None, *, api_port: int | None = None, stop: asyncio.Event | None = None,
                       ready: Callable[[dict[str, str], Any], None] | None = None,
                       builders: list[Callable[[], Any]] | None = None) -> None:
    """Run every service and the gateway until `stop` (or SIGINT/SIGTERM). `ready(upstreams, gateway)`
    is called once everything answers; `api_port` None means WHETSTONE_API_PORT (default 8000)."""
    from whetstone.gateway.config import GatewaySettings  # noqa: PLC0415
    from whetstone.gateway.server import start_gateway  # noqa: PLC0415
    from whetstone.runtime.service import run_services  # noqa: PLC0415

    stop = stop or asyncio.Event()
    started: asyncio.Future = asyncio.get_running_loop().create_future()
    chosen = build_services(builders, []) if builders else build_services(core_service_builders(),
                                                                          optional_service_builders())
    services = asyncio.create_task(run_services(chosen, settings, started.set_result, stop))
    gateway = None
    try:
        await asyncio.wait((services, started), return_when=asyncio.FIRST_COMPLETED)
        if not started.done():  # the services ended before they were all up: their error, if any
            services.result()
            return
        upstreams = upstreams_of(started.result())
        gateway = await start_gateway(GatewaySettings(), upstreams, port=api_port)
        if ready:
            ready(upstreams, gateway)
        await services
    finally:
        stop.set()
        if gateway is not None:
            await gateway.stop()
        if not services.done():
            await services
