"""Event time: how far the consumed streams have got. Pure.

Grace periods ("the start of this stop never came", "this segment never stopped",
"no more segments will come for this job") are measured against this clock, not the
wall clock. Replaying a backlog from offset 0, one topic runs hours ahead of another;
by the wall clock a stop would wait in vain for a start that is merely further back in
its own topic. Event time is the oldest of the newest emission times seen on the
partitions that still have messages to deliver (consumer lag > 0): everything emitted
before it has been consumed, give or take producers' clock skew, which the grace
periods absorb. A lagging partition not read yet holds it at the epoch. When every
partition is caught up, everything emitted so far has been read: event time is the
wall clock, or the newest emission time seen if a producer's clock runs ahead.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

NOTHING_READ = datetime(1970, 1, 1, tzinfo=UTC)

Partition = tuple[str, int]


class EventClock:
    def __init__(self) -> None:
        self._latest: dict[Partition, datetime] = {}  # newest emission time seen per partition
        self._lag: dict[Partition, int] = {}          # messages left per partition

    def observe(self, topic: str, partition: int, occurred_at: datetime) -> None:
        key = (topic, partition)
        latest = self._latest.get(key)
        if latest is None or occurred_at > latest:
            self._latest[key] = occurred_at

    def set_lag(self, lag: Mapping[Partition, int]) -> None:
        self._lag = dict(lag)

    def now(self, wall: datetime) -> datetime:
        behind = [self._latest.get(p, NOTHING_READ) for p, left in self._lag.items() if left > 0]
        if behind:
            return min([*behind, wall])
        return max([*self._latest.values(), wall])
