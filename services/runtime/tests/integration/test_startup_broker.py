"""Start-up waits for a broker that is not reachable yet (restarting, starting in another pod) instead of
the process exiting at once; after its budget it gives up with the connection error. On the embedded
broker, reached first through a port that nobody listens on and later through a forwarder to it."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from aiokafka.errors import KafkaConnectionError
from whetstone.contracts import all_topic_partitions
from whetstone.devstack.forwarder import Forwarder
from whetstone.devstack.testing import topic_partitions
from whetstone.runtime.topics import create_topics_async, ensure_topics

pytestmark = pytest.mark.integration

JOB = "ftjob-" + "a" * 24
JOB_PROGRESS_PARTITIONS = dict(all_topic_partitions())["job.progress"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_start_up_gives_up_only_after_its_wait_budget(settings):
    dead = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{_free_port()}", "startup_broker_wait_s": 2.0})
    began = time.monotonic()
    with pytest.raises(KafkaConnectionError):
        await ensure_topics(dead)
    assert time.monotonic() - began >= 1.0  # it retried (0.5 s, 1 s pauses) before giving up


async def test_start_up_waits_for_the_broker_to_come_up(settings):
    host, port = settings.kafka_bootstrap.rsplit(":", 1)
    late = _free_port()

    async def broker_comes_up() -> Forwarder:
        await asyncio.sleep(1.5)  # the first attempts find nobody listening
        forwarder = Forwarder(host, int(port), late)
        await forwarder.up()
        return forwarder

    waiting = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{late}", "startup_broker_wait_s": 60.0})
    began = time.monotonic()
    server_task = asyncio.create_task(broker_comes_up())
    await asyncio.wait_for(ensure_topics(waiting), timeout=60)
    assert time.monotonic() - began >= 1.5
    await (await server_task).down()


async def test_a_service_waits_for_a_broker_lost_after_its_topics_were_made(settings):
    """The topics exist (an earlier start made them) but the broker is unreachable when the service's
    consumer and outbox producer connect, as when the durable broker's storage is away: the service
    waits for it and then consumes, instead of exiting with "Unable to bootstrap"."""
    from whetstone.contracts import JobProgressV1
    from whetstone.devstack.testing import send_event
    from whetstone.runtime.service import Runtime, Service

    seen: list[str] = []

    async def handler(rt, uow, env, ev) -> None:
        seen.append(ev.job_id)

    host, port = settings.kafka_bootstrap.rsplit(":", 1)
    late = _free_port()
    waiting = settings.model_copy(update={"kafka_bootstrap": f"127.0.0.1:{late}", "startup_broker_wait_s": 60.0,
                                          "create_topics": False})
    rt = Runtime(Service(name="late-broker", subscriptions={"job.progress": handler}), waiting)

    async def broker_comes_up() -> Forwarder:
        await asyncio.sleep(2.0)
        forwarder = Forwarder(host, int(port), late)
        await forwarder.up()
        return forwarder

    server_task = asyncio.create_task(broker_comes_up())
    began = time.monotonic()
    try:
        await asyncio.wait_for(rt.start(), timeout=90)
        assert time.monotonic() - began >= 2.0
        await send_event(settings.kafka_bootstrap, JobProgressV1(job_id=JOB, segment_id="s1", step=1), "demo")
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert seen == [JOB]
    finally:
        await rt.stop()
        await (await server_task).down()


async def test_start_up_waits_while_the_durable_broker_cannot_create_topics(settings, tmp_path):
    """The durable broker keeps its log in S3; while S3 is away it answers CreateTopics with
    UNKNOWN_SERVER_ERROR (-1) after about 3 s. A service starting then (a chaos run's scheduler did)
    waits and creates its topics once S3 is back, instead of exiting with UnknownError."""
    from whetstone.devstack.stack import EmbeddedStack

    stack = EmbeddedStack(tmp_path / "stack", broker_storage="s3", log=lambda m: None)
    endpoints = stack.start()
    try:
        durable = settings.model_copy(update={"kafka_bootstrap": endpoints.kafka_bootstrap,
                                              "startup_broker_wait_s": 90.0})
        await create_topics_async(endpoints.kafka_bootstrap, [("warm", 1)])   # the broker up and answering
        stack.stop_component("s3")
        starting = asyncio.create_task(ensure_topics(durable))
        await asyncio.sleep(8)           # long enough for the broker's first -1 answers
        assert not starting.done(), starting.exception()   # the message is only built when it is done
        stack.start_component("s3")
        await asyncio.wait_for(starting, timeout=90)
        assert await topic_partitions(endpoints.kafka_bootstrap, "job.progress") == JOB_PROGRESS_PARTITIONS
    finally:
        stack.stop(discard=True)

