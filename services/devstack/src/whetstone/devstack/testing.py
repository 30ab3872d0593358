"""Pytest plugin shared by every test tier (loaded with `-p whetstone.devstack.testing`).

Integration tests get a fresh, real embedded stack per test (about 3.5 s) and run real
services against it; nothing here fakes Kafka, Postgres or S3."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from whetstone.contracts import TOPICS, Envelope, Event, all_topic_partitions

if TYPE_CHECKING:
    from whetstone.runtime.service import Runtime
    from whetstone.runtime.settings import CommonSettings

SERVICE_ENV = ("INGEST", "SCHEDULER", "TRAINER_AGENT", "EVAL", "REGISTRY", "METERING", "SERVING")


def pytest_configure(config: pytest.Config) -> None:
    """Each session gets its own temporary root, traversable by the unprivileged user the
    embedded PostgreSQL runs as. pytest's shared `pytest-of-<user>` root is reset to mode 0700 by
    every session that starts, which would cut a concurrently running session's PostgreSQL off its
    own data directory."""
    if config.option.basetemp is None and not os.environ.get("PYTEST_DEBUG_TEMPROOT") \
            and not hasattr(config, "workerinput"):
        root = Path(tempfile.mkdtemp(prefix="whetstone-pytest-"))
        root.chmod(0o755)
        config.option.basetemp = str(root / "t")
        config._whetstone_temp_root = root  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    root = getattr(config, "_whetstone_temp_root", None)
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


class _SpareStacks:
    """Starts the next test's stack while the current test runs: a stack takes about 3.5 s to start,
    mostly waiting on its servers, so an integration test takes one that is already up and the next
    one starts beside it (children are forked by the stack's one spawner thread, so starting from
    this background thread ties nothing to it). A spare is a fresh stack that no test has touched."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spare-stack")
        self.next: concurrent.futures.Future[Any] | None = None
        self.count = 0

    def _start(self) -> tuple[Any, Any]:
        from .stack import EmbeddedStack  # noqa: PLC0415

        self.count += 1
        s = EmbeddedStack(self.root / f"stack-{self.count}", topics=all_topic_partitions(), buckets=["whetstone"],
                          log=lambda m: None)
        return s, s.start()

    def take(self) -> tuple[Any, Any]:
        ahead, self.next = self.next, self.pool.submit(self._start)
        if ahead is None:
            return self._start()
        try:
            return ahead.result()
        except Exception:  # noqa: BLE001 - a spare that failed to start: start one in the foreground
            return self._start()

    def close(self) -> None:
        if self.next is not None:
            try:
                s, _ = self.next.result()
                s.stop(discard=True)
                shutil.rmtree(s.data_dir, ignore_errors=True)
            except Exception:  # noqa: BLE001 - nothing to stop
                pass
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def _spare_stacks(tmp_path_factory: pytest.TempPathFactory):
    spares = _SpareStacks(tmp_path_factory.mktemp("stacks"))
    yield spares
    spares.close()


@pytest.fixture
def stack(_spare_stacks: _SpareStacks):
    s, endpoints = _spare_stacks.take()
    try:
        yield endpoints
    finally:
        s.stop(discard=True)  # a test's stack: nothing in it outlives the test
        shutil.rmtree(s.data_dir, ignore_errors=True)


def use_stack(env: pytest.MonkeyPatch, endpoints: dict[str, str], data_dir: Path) -> CommonSettings:
    """Point every service at the embedded stack's endpoints and `data_dir`, on free HTTP ports,
    offline; the common settings that follow."""
    from whetstone.runtime.settings import CommonSettings  # noqa: PLC0415

    for k, v in endpoints.items():
        env.setenv(k, v)
    env.setenv("WHETSTONE_DATA_DIR", str(data_dir))
    for svc in SERVICE_ENV:
        env.setenv(f"WHETSTONE_{svc}_HTTP_PORT", "0")
    env.setenv("HF_HUB_OFFLINE", "1")
    return CommonSettings(log_json=True)


@pytest.fixture
def settings(stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    return use_stack(monkeypatch, stack.as_env(), tmp_path)


@dataclass
class Platform:
    runtimes: dict[str, Runtime[Any]]     # by service name
    settings: CommonSettings

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.runtimes[service].http.port}"

    def __getitem__(self, service: str) -> Runtime[Any]:
        return self.runtimes[service]


@pytest.fixture
def platform(settings) -> Callable[..., Any]:
    """``async with platform(build_a, build_b) as p:`` runs those services until the block ends."""
    from whetstone.runtime.service import run_services  # noqa: PLC0415

    @asynccontextmanager
    async def run(*builders: Callable[[], Any]) -> AsyncIterator[Platform]:
        stop = asyncio.Event()
        ready: dict[str, Runtime[Any]] = {}
        task = asyncio.create_task(run_services([b() for b in builders], settings,
                                                lambda rts: ready.update({r.name: r for r in rts}), stop,
                                                handle_signals=False))
        while not ready:
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        try:
            yield Platform(ready, settings)
        finally:
            stop.set()
            await task

    return run


async def send(bootstrap: str, topic: str, value: bytes, key: str = "k", times: int = 1) -> None:
    """Put raw bytes on a topic (``times`` copies: at-least-once redelivery)."""
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for _ in range(times):
            await producer.send_and_wait(topic, value, key=key.encode())
    finally:
        await producer.stop()


async def send_event(bootstrap: str, event: Event, tenant_id: str, times: int = 1, **env_fields: Any) -> Envelope:
    """One envelope, delivered ``times`` times with the same event_id."""
    from whetstone.runtime.messaging import encode, make_envelope  # noqa: PLC0415

    env = make_envelope(event, producer="test", tenant_id=tenant_id)
    if env_fields:
        env = env.model_copy(update=env_fields)
    await send(bootstrap, TOPICS[event.EVENT_TYPE].name, encode(env), env.key, times)
    return env


async def producer_token(scheduler: Any, tenant_id: str, *, expires_in_s: int | None = None) -> str:
    """A producer token for `tenant_id`, issued as `whet keys create-producer` issues one: signed with
    the internal secret of the scheduler runtime `scheduler` and recorded in its key table (the
    scheduler refuses a token it has no record of). What an external `job.requested` producer sends."""
    from whetstone.runtime.identity import internal_secret  # noqa: PLC0415
    from whetstone.scheduler.adapters.keys import KeyStore  # noqa: PLC0415

    _, token = await KeyStore(scheduler.pool).create_producer(
        tenant_id, internal_secret(scheduler.settings.data_dir), expires_in_s=expires_in_s)
    return token


async def until(fetch: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], timeout: float, what: str) -> Any:
    """Fetch every 0.5 s until `done(value)`; the failure message shows the last value fetched."""
    deadline = time.monotonic() + timeout
    while True:
        value = await fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {value}"
        await asyncio.sleep(0.5)


async def wait_until(check: Callable[[], Awaitable[Any]], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def outbox(rt: Any, topic: str) -> list[dict]:
    """Envelopes a service committed for ``topic`` (sent or not), oldest first."""
    rows = await rt.pool.fetch("SELECT value FROM outbox WHERE topic = $1 ORDER BY id", topic)
    return [json.loads(bytes(r["value"])) for r in rows]


async def consume_all(bootstrap: str, topic: str, timeout: float = 3.0) -> list[bytes]:
    """Every message currently on a topic, from the beginning (a fresh consumer group)."""
    import uuid  # noqa: PLC0415

    from aiokafka import AIOKafkaConsumer  # noqa: PLC0415

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"test-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    out: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300)
            for records in batch.values():
                out += [r.value for r in records]
    finally:
        await consumer.stop()
    return out


async def topic_partitions(bootstrap: str, topic: str) -> int:
    """How many partitions the broker says `topic` has."""
    from aiokafka.admin import AIOKafkaAdminClient  # noqa: PLC0415

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (description,) = await admin.describe_topics([topic])
        return len(description["partitions"])
    finally:
        await admin.close()


async def group_members(bootstrap: str, group: str) -> list[str]:
    """The member ids the broker lists for consumer group `group` (DescribeGroups)."""
    from aiokafka.admin import AIOKafkaAdminClient  # noqa: PLC0415

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = (await admin.describe_consumer_groups([group]))[0].to_object()["groups"][0]
        return [m["member_id"] for m in described["members"]]
    finally:
        await admin.close()
