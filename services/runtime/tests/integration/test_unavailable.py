"""While PostgreSQL restarts, a service's API answers 503 `service_unavailable` in OpenAI's error shape with
Retry-After (never a bare 500), and the official `openai` client, which retries 503 after Retry-After,
gets its answer once the database is back. On the real embedded PostgreSQL, stopped and started again."""

from __future__ import annotations

import asyncio
import threading
import time

import asyncpg
import httpx
import openai
import pytest
from aiokafka.errors import KafkaConnectionError
from botocore.exceptions import ClientError, EndpointConnectionError
from fastapi import FastAPI
from whetstone.devstack.stack import EmbeddedStack
from whetstone.runtime import db
from whetstone.runtime.errors import unavailable_dependency
from whetstone.runtime.http import HttpServer, ServiceMetrics, make_app
from whetstone.runtime.messaging import unit_of_work

pytestmark = pytest.mark.integration


def test_which_failures_are_an_unreachable_dependency():
    assert unavailable_dependency(asyncpg.exceptions.AdminShutdownError("terminating")) == "database"
    assert unavailable_dependency(asyncpg.exceptions.CannotConnectNowError("starting up")) == "database"
    assert unavailable_dependency(asyncpg.InterfaceError("connection is closed")) == "database"
    assert unavailable_dependency(EndpointConnectionError(endpoint_url="http://s3")) == "object store"
    assert unavailable_dependency(KafkaConnectionError("no broker")) == "broker"
    assert unavailable_dependency(ConnectionRefusedError(111, "refused")) == "a dependency"
    slow = ClientError({"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 500}}, "GetObject")
    assert unavailable_dependency(slow) == "object store"
    missing = ClientError({"Error": {"Code": "NoSuchKey"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "GetObject")
    assert unavailable_dependency(missing) is None
    try:
        try:
            raise ConnectionResetError("reset")
        except ConnectionResetError as inner:
            raise RuntimeError("upload failed") from inner
    except RuntimeError as wrapped:
        assert unavailable_dependency(wrapped) == "a dependency"
    assert unavailable_dependency(ExceptionGroup("two", [ValueError("x"), TimeoutError()])) == "a dependency"
    assert unavailable_dependency(RuntimeError("a bug")) is None
    assert unavailable_dependency(asyncpg.exceptions.UniqueViolationError("dup")) is None


def app_on(pool: asyncpg.Pool) -> FastAPI:
    app = make_app("probe", ServiceMetrics("probe"), {})

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str) -> dict:
        answer = await pool.fetchval("SELECT 42")
        return {"id": model_id, "object": "model", "created": answer, "owned_by": "whetstone"}

    @app.get("/v1/bug")
    async def bug() -> dict:
        raise KeyError("not a dependency")

    return app


async def test_postgres_restart_answers_503_with_retry_after_and_the_openai_client_gets_through(tmp_path):
    stack = EmbeddedStack(tmp_path / "stack", log=lambda m: None)
    endpoints = await asyncio.to_thread(stack.start)
    pool = await db.create_pool(endpoints.database_url, "probe")
    server = HttpServer(app_on(pool), "127.0.0.1", 0)
    await server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=10) as c:
            assert (await c.get("/v1/models/m1")).json()["created"] == 42
            bug = await c.get("/v1/bug")  # a bug is a 500, in the same shape
            assert bug.status_code == 500 and bug.json()["error"]["type"] == "server_error"

            await asyncio.to_thread(stack.stop_component, "postgres", kill=True)
            down = await c.get("/v1/models/m1")
            assert down.status_code == 503, down.text
            assert down.json()["error"]["code"] == "service_unavailable"
            assert set(down.json()["error"]) == {"message", "type", "param", "code"}
            assert "database" in down.json()["error"]["message"]
            assert 0 < int(down.headers["retry-after"]) <= 60

        # the SDK (its own retries only) sees 503s while the database is down, waits Retry-After, and gets through
        restarted = threading.Timer(1.0, stack.start_component, args=("postgres",))
        began = time.monotonic()
        restarted.start()
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=5, timeout=30)
        model = await client.models.retrieve("m1")
        restarted.join()
        assert model.id == "m1" and time.monotonic() - began >= 1.0
        no_retries = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        await asyncio.to_thread(stack.stop_component, "postgres")
        with pytest.raises(openai.InternalServerError) as caught:
            await no_retries.models.retrieve("m1")
        assert caught.value.status_code == 503 and caught.value.code == "service_unavailable"
    finally:
        await server.stop()
        pool.terminate()
        await asyncio.to_thread(stack.stop)


def test_a_connection_left_mid_message_is_the_database_going_away_not_a_bug():
    # what asyncpg raises when the server's FATAL goodbye reached a pooled connection before its close did
    broken = asyncpg.exceptions.InternalClientError("cannot switch to state 15; another operation (2) is in progress")
    assert unavailable_dependency(broken) == "database"
    assert unavailable_dependency(asyncpg.exceptions.InternalClientError(
        "PoolConnectionHolder.release() called on a free connection holder")) is None


async def test_a_unit_of_work_that_lost_its_database_never_returns_the_connection_to_the_pool(tmp_path):
    stack = EmbeddedStack(tmp_path / "stack", log=lambda m: None)
    endpoints = await asyncio.to_thread(stack.start)
    pool = await db.create_pool(endpoints.database_url, "probe", min_size=1, max_size=1)
    try:
        async def backend() -> int:
            async with unit_of_work(pool, "probe") as uow:
                return await uow.conn.fetchval("SELECT pg_backend_pid()")

        first = await backend()
        with pytest.raises(KeyError):            # the caller's own error: the connection is fine, kept
            async with unit_of_work(pool, "probe") as uow:
                await uow.conn.execute("SELECT 1")
                raise KeyError("a bug")
        assert await backend() == first
        with pytest.raises(asyncpg.exceptions.InternalClientError):   # a broken connection: replaced
            async with unit_of_work(pool, "probe") as uow:
                await uow.conn.execute("SELECT 1")
                raise asyncpg.exceptions.InternalClientError("cannot switch to state 15; another operation (2) is in progress")
        assert await backend() != first
    finally:
        pool.terminate()
        await asyncio.to_thread(stack.stop)
