"""Topic administration: topics are created explicitly at start-up with their partition counts.

Works against any Kafka-protocol broker (the embedded Tansu, Apache Kafka, Redpanda, MSK)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import structlog
from aiokafka.errors import KafkaError

from whetstone.contracts import all_topic_partitions

from .delivery import is_transient
from .settings import CommonSettings

T = TypeVar("T")


class BrokerFailedToCreateTopic(KafkaError):  # type: ignore[misc]  # aiokafka is untyped
    """The broker failed to create a topic on its side (UNKNOWN_SERVER_ERROR, -1), as the durable
    broker answers while its object store is away: retriable, so start-up waits for it
    (`while_unreachable`) instead of the service exiting."""

    errno, retriable = -1, True
    message = "UNKNOWN_SERVER_ERROR"


async def create_topics_async(bootstrap: str, topics: Sequence[tuple[str, int]], **client_options: Any) -> None:
    """Create `(name, partitions)` topics; a topic that already exists is left as it is."""
    if not topics:
        return
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError, for_code

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1) for name, partitions in topics]
        )
        for name, error_code, message, *_ in response.topic_errors:
            if error_code in (0, TopicAlreadyExistsError.errno):
                continue
            if error_code == -1:
                raise BrokerFailedToCreateTopic(f"creating topic {name!r}: {message}")
            raise for_code(error_code)(f"creating topic {name!r}: {message}")
    finally:
        await admin.close()

def create_topics(bootstrap: str, topics: Sequence[tuple[str, int]]) -> None:
    """Sync wrapper of `create_topics_async`; works against any Kafka-protocol broker."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(create_topics_async(bootstrap, topics))
        return
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # called from inside a loop
        pool.submit(asyncio.run, create_topics_async(bootstrap, topics)).result()

async def ensure_topics(settings: CommonSettings) -> None:
    """Every topic of the contracts' table and its dead-letter topic (unless an operator manages them).
    A broker that cannot be reached (restarting, not up yet) is waited for (`while_unreachable`)."""
    if not settings.create_topics:
        return
    bootstrap = settings.kafka_bootstrap
    if not bootstrap:
        raise ValueError("no Kafka bootstrap configured (WHETSTONE_KAFKA_BOOTSTRAP)")
    await while_unreachable(settings, "topics", lambda: create_topics_async(
        bootstrap, all_topic_partitions(), **settings.kafka_client_options()))


async def while_unreachable(settings: CommonSettings, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
    """`attempt()` until it succeeds, while the broker cannot be reached (or fails on its side) at
    start-up: with capped backoff, up to `startup_broker_wait_s` in all, instead of the process
    exiting at once. Any other error, or the budget spent, raises. `attempt` must start from
    scratch each time."""
    log = structlog.get_logger("whetstone.runtime.topics")
    deadline = time.monotonic() + settings.startup_broker_wait_s
    pause = 0.5
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + pause > deadline:
                raise
            log.warning("broker unavailable at start-up; retrying", bootstrap=settings.kafka_bootstrap, step=what,
                        error=f"{type(exc).__name__}: {exc}", retry_in_s=pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 10.0)
