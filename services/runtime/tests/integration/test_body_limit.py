"""A service's HTTP edge: a body over the cap is a 413 in OpenAI's shape, before it is
read when Content-Length says so, once past the cap when it streams; uploads pass under their own
limit; /docs and /openapi.json are off unless asked for; /healthz names no error text. On a real
uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from fastapi import Request
from whetstone.runtime.http import BodyLimit, HttpServer, ServiceMetrics, make_app

pytestmark = pytest.mark.integration
LIMIT = 64 * 1024


async def failing_check() -> None:
    raise RuntimeError("password authentication failed for user whetstone at /var/run/postgresql")


def app_with(docs: bool = False):
    app = make_app("probe", ServiceMetrics("probe"), {"postgres": failing_check}, docs=docs)
    seen = {"bytes": 0}

    @app.post("/v1/echo")
    async def echo(body: dict) -> dict:
        return {"keys": len(body)}

    @app.post("/v1/files")
    async def upload(request: Request) -> dict:
        async for chunk in request.stream():
            seen["bytes"] += len(chunk)
        return {"bytes": seen["bytes"]}

    return app, seen


async def raw_post(port: int, head: bytes, body: bytes = b"") -> tuple[bytes, float]:
    """Headers (and maybe part of a body) on a raw socket; the answer's status line and how long it took."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head + body)
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 5)
    writer.close()
    return line, time.perf_counter() - started


async def test_bodies_over_the_cap_are_refused_uploads_pass_docs_off_health_quiet():
    app, seen = app_with()
    server = HttpServer(BodyLimit(app, LIMIT, exempt=("/v1/files",)), "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=10) as c:
            assert (await c.post("/v1/echo", json={"a": "x" * 1000})).json() == {"keys": 1}
            # a declared 200 MB body: refused from the headers alone, not one byte of it sent
            line, took = await raw_post(server.port, b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                        b"application/json\r\nContent-Length: 200000000\r\n\r\n")
            assert line.startswith(b"HTTP/1.1 413") and took < 2, (line, took)
            big = await c.post("/v1/echo", json={"training_file": "x" * (LIMIT + 10)})
            assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

            async def chunks():   # no Content-Length: counted as it arrives
                for _ in range(64):
                    yield b" " * 8192

            streamed = await c.post("/v1/echo", content=chunks(), headers={"Content-Type": "application/json"})
            assert streamed.status_code == 413 and streamed.json()["error"]["type"] == "invalid_request_error"
            # a chunked body past the cap whose sender then stalls: answered anyway, within seconds
            chunk = b"10000\r\n" + b" " * 65536 + b"\r\n"
            line, took = await raw_post(server.port, b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                        b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n", chunk * 2)
            assert line.startswith(b"HTTP/1.1 413") and took < 4, (line, took)
            bad = await raw_post(server.port, b"POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
            assert not bad[0].startswith(b"HTTP/1.1 2")
            # an upload route streams past the cap under its own limit
            up = await c.post("/v1/files", content=b"y" * (LIMIT * 4))
            assert up.status_code == 200 and up.json()["bytes"] == LIMIT * 4
            for path in ("/docs", "/openapi.json", "/redoc"):
                assert (await c.get(path)).status_code == 404, path
            assert app.openapi()["paths"]          # still built in process (tests and tools enumerate routes)
            health = await c.get("/healthz")
            assert health.status_code == 503 and health.json()["checks"] == {"postgres": "unavailable"}
            assert "password" not in health.text and "/var/run" not in health.text
    finally:
        await server.stop()


async def test_docs_are_served_when_the_operator_asks():
    app, _ = app_with(docs=True)
    server = HttpServer(app, "127.0.0.1", 0)
    await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as c:
            assert (await c.get("/openapi.json")).status_code == 200 and (await c.get("/docs")).status_code == 200
    finally:
        await server.stop()
