"""Which replica owns a job: the one holding its partition of every lifecycle topic.

The lifecycle topics are keyed by job id, so Kafka's default partitioner (murmur2 of the key, made
positive, modulo the partition count: what the platform's producers use) puts all of a job's events
on the same partition number of each topic. Metering's replicas take partitions by range
(bootstrap.consumer_options), which gives each the same partition numbers of every topic when the
topics have one partition count: a replica then consumes every event of its jobs, and only its own
event clock may settle them (usecases/sweep.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aiokafka.partitioner import murmur2


def key_hash(key: str) -> int:
    """The partitioner's hash of a record key (non-negative, fits a Postgres int): the partition is
    this modulo the topic's partition count."""
    hashed: int = murmur2(key.encode())
    return hashed & 0x7FFFFFFF


@dataclass(frozen=True)
class Ownership:
    """The partition numbers a replica holds of every lifecycle topic, out of `count`."""

    count: int
    partitions: frozenset[int]

    def owns(self, key: str) -> bool:
        return key_hash(key) % self.count in self.partitions


def ownership(assigned: Iterable[tuple[str, int]], counts: Mapping[str, int], topics: Sequence[str]) -> Ownership | None:
    """What a member holding `assigned` (topic, partition) pairs owns, given each topic's partition count.
    None when it can own nothing safely: no assignment, or topics whose partition counts differ (a
    job's events would then land on different partition numbers)."""
    sizes = {counts.get(t, 0) for t in topics}
    if len(sizes) != 1 or 0 in sizes:
        return None
    held: dict[str, set[int]] = {t: set() for t in topics}
    for topic, partition in assigned:
        if topic in held:
            held[topic].add(partition)
    owned = frozenset.intersection(*(frozenset(p) for p in held.values()))
    return Ownership(sizes.pop(), owned) if owned else None
