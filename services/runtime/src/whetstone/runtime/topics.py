"""Topic administration: topics are created explicitly at start-up with their partition counts.

Works against any Kafka-protocol broker (the embedded Tansu, Apache Kafka, Redpanda, MSK)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from typing import Any

from whetstone.contracts import all_topic_partitions

from .settings import CommonSettings

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
    """Every topic of the contracts' table and its dead-letter topic (unless an operator manages them)."""
    if not settings.create_topics:
        return
    await create_topics_async(settings.kafka_bootstrap, all_topic_partitions(), **settings.kafka_client_options())
