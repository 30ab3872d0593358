"""Event time: how far the consumed streams have got. Pure.

Grace periods ("the start of this stop never came", "this segment never stopped",
"no more segments will come for this job") are measured against this clock, not the
wall clock. Replaying a backlog from offset 0, one topic runs hours ahead of another;
by the wall clock a stop would wait in vain for a start that is merely further back in
its own topic.

While some partitions still have messages to deliver (consumer lag > 0), event time
is the oldest of the newest emission times they delivered: everything emitted before
it has been consumed, give or take producers' clock skew, which the grace periods
absorb. A lagging partition not read yet holds it at the epoch, and so does a lag
that is not known (nothing assigned yet, a partition not fetched since it was
assigned: lag None or -1); a restarted consumer therefore decides nothing by time
until it has seen where its partitions stand. Once every partition is caught up, event time
runs with the wall clock from the newest emission seen by this process, or the newest time a
decision recorded before it started waits on (`resume`); a producer whose clock runs ahead cannot
freeze it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

NOTHING_READ = datetime(1970, 1, 1, tzinfo=UTC)

Partition = tuple[str, int]


class EventClock:
    def __init__(self) -> None:
        self._latest: dict[Partition, datetime] = {}  # newest emission time seen per partition
        self._lag: dict[Partition, int] | None = None  # messages left per partition (-1: unknown)
        self._newest: datetime | None = None          # newest emission time seen at all ...
        self._newest_seen: datetime | None = None     # ... and the wall time it was seen

    def observe(self, topic: str, partition: int, occurred_at: datetime, wall: datetime) -> None:
        key = (topic, partition)
        latest = self._latest.get(key)
        if latest is None or occurred_at > latest:
            self._latest[key] = occurred_at
        self._advance(occurred_at, wall)

    def resume(self, newest: datetime, wall: datetime) -> None:
        """Start from the newest event time a decision recorded before this process started waits on
        (an unclosed job's outcome, a waiting segment's stop): once caught up, a restarted consumer runs
        on from there, and not only from the few events left for it to read, which may all be older
        than the ones a killed predecessor handled last."""
        self._advance(newest, wall)

    def _advance(self, occurred_at: datetime, wall: datetime) -> None:
        if self._newest is None or occurred_at > self._newest:
            self._newest, self._newest_seen = occurred_at, wall

    def set_lag(self, lag: Mapping[Partition, int] | None) -> None:
        self._lag = dict(lag) if lag else None

    def now(self, wall: datetime) -> datetime:
        if self._lag is None:
            return NOTHING_READ
        behind = [self._latest.get(p, NOTHING_READ) for p, left in self._lag.items() if left != 0]
        if behind:
            return min([*behind, wall])
        if self._newest is None or self._newest_seen is None:
            return wall
        return max(wall, self._newest + (wall - self._newest_seen))
