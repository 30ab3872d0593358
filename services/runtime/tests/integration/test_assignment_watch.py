"""The assignment watchdog (runtime/assignment.py): a member handed an assignment that leaves a topic's
partitions to nobody, records waiting there, rejoins as a new member and consumes them. A chaos run's
broker, its group state broken by an S3 outage, kept giving metering such an assignment. Reproduced on
the real embedded broker with a group leader whose assignor forgets one topic on its first assignment
(aiokafka assigns on the client, so the broken assignment reaches the broker like any other)."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from whetstone.devstack.testing import send
from whetstone.runtime.assignment import stalled, watch_assignment

pytestmark = pytest.mark.integration

FORGOTTEN, KEPT = "model.promoted", "model.registered"


class Forgetful(RoundRobinPartitionAssignor):
    name = "forgetful"
    forgot = 0

    @classmethod
    def assign(cls, cluster, member_metadata):
        assignment = super().assign(cluster, member_metadata)
        if cls.forgot == 0:  # the first assignment leaves FORGOTTEN to nobody
            cls.forgot += 1
            for member, a in assignment.items():
                a.assignment = [(t, p) for t, p in a.assignment if t != FORGOTTEN]
        return assignment


def test_stalled_means_not_held_records_waiting_and_no_progress_since_the_last_look():
    a, b, c = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("t", 2)
    committed, end = {a: 5, b: 5, c: 7}, {a: 9, b: 5, c: 9}
    assert stalled({a, b, c}, committed, end, {a: 5, b: 5, c: 6}) == {a}  # b: nothing waiting; c: moved
    assert stalled({a, b, c}, committed, end, {}) == set()                 # a first look judges nothing
    assert stalled({b}, committed, end, {b: 5}) == set()


async def test_a_member_whose_assignment_leaves_a_topic_to_nobody_rejoins_and_consumes_it(settings):
    bootstrap = settings.kafka_bootstrap
    for i in range(3):
        await send(bootstrap, FORGOTTEN, f"waiting-{i}".encode(), key=f"k{i}")
    consumer = AIOKafkaConsumer(FORGOTTEN, KEPT, bootstrap_servers=bootstrap, group_id=f"watch-{uuid.uuid4().hex[:8]}",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                partition_assignment_strategy=(Forgetful,))
    await consumer.start()
    watchdog = asyncio.create_task(watch_assignment(SimpleNamespace(consumer=consumer), "probe", check_s=0.5,
                                                    strikes=2))
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        first_assignment = None
        while len(got) < 3 and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=300)
            if first_assignment is None and consumer.assignment():
                first_assignment = {tp.topic for tp in consumer.assignment()}
            for tp, records in batches.items():
                got += [r.value for r in records if tp.topic == FORGOTTEN]
                await consumer.commit()
        assert first_assignment == {KEPT}  # the broken assignment did happen
        assert sorted(got) == [b"waiting-0", b"waiting-1", b"waiting-2"]
        assert {tp.topic for tp in consumer.assignment()} == {FORGOTTEN, KEPT}
    finally:
        watchdog.cancel()
        await asyncio.gather(watchdog, return_exceptions=True)
        await consumer.stop()
