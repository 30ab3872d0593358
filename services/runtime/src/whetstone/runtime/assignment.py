"""A watchdog for partitions that no live group member consumes.

A chaos run left metering with every partition of its topics but those of `job.completed`: it
joined while the durable broker could not read its topics and groups from S3, and the broker's
group coordinator (it panicked on that path) kept handing back the assignment made without them,
rejoin after rejoin, while the member's heartbeats kept it "stable". Nothing in the Kafka client
notices, because the group is healthy by its own account.

So every `CHECK_S` the service compares what it consumes with what its topics have. A partition
that this member does not hold, that has records waiting, and whose group offset has not moved for
`STRIKES` checks in a row is consumed by nobody (another replica that holds it would move it).
The member then leaves the group and joins again as a new member, which gets a fresh assignment.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiokafka import TopicPartition

from .logging import get_logger

CHECK_S = 20.0
STRIKES = 3

log = get_logger("whetstone.assignment")


def stalled(missing: set[TopicPartition], committed: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
            before: Mapping[TopicPartition, int]) -> set[TopicPartition]:
    """Of the partitions this member does not hold, those with records waiting (end offset past the
    group's committed offset) whose committed offset is the same as at the last check."""
    return {tp for tp in missing
            if end.get(tp, 0) > committed.get(tp, 0) and tp in before and before[tp] == committed.get(tp, 0)}


async def watch_assignment(subscriber: Any, service: str, check_s: float = CHECK_S, strikes: int = STRIKES) -> None:
    """Runs beside a consumer for as long as the service does (see the module docstring)."""
    before: dict[TopicPartition, int] = {}
    count = 0
    while True:
        await asyncio.sleep(check_s)
        consumer = getattr(subscriber, "consumer", None)
        if consumer is None:
            continue
        try:
            topics = set(consumer.subscription())
            expected = {TopicPartition(t, p) for t in topics for p in (consumer.partitions_for_topic(t) or ())}
            missing = expected - set(consumer.assignment())
            if not missing:
                before, count = {}, 0
                continue
            committed = {tp: (await consumer.committed(tp)) or 0 for tp in missing}
            end = await consumer.end_offsets(sorted(missing))
        except Exception as exc:  # broker away: nothing to judge by; look again later
            log.debug("assignment check skipped", service=service, error=f"{type(exc).__name__}: {exc}")
            continue
        count = count + 1 if stalled(missing, committed, end, before) else 0
        before = committed
        if count < strikes:
            continue
        log.warning("partitions with records waiting are consumed by no member of the group; rejoining as a new"
                    " member", service=service, partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in missing))
        listener = getattr(getattr(consumer, "_subscription", None), "listener", None)
        consumer.unsubscribe()  # leaves the group: the next join is a new member with a fresh assignment
        consumer.subscribe(topics=sorted(topics), listener=listener)
        before, count = {}, 0
