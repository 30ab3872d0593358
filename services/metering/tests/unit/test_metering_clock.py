"""Event time: the oldest newest-time over partitions that still lag; caught-up ones do not count."""

from datetime import UTC, datetime, timedelta

import pytest

from whetstone.metering.domain.clock import NOTHING_READ, EventClock

pytestmark = pytest.mark.unit
WALL = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def test_caught_up_event_time_is_the_wall_clock():
    clock = EventClock()
    assert clock.now(WALL) == WALL
    clock.observe("job.started", 0, WALL - timedelta(days=3))
    clock.set_lag({("job.started", 0): 0})
    assert clock.now(WALL) == WALL


def test_a_lagging_partition_holds_event_time_at_the_newest_it_delivered():
    clock = EventClock()
    clock.observe("job.completed", 0, WALL - timedelta(minutes=1))
    clock.observe("job.started", 1, WALL - timedelta(days=30))  # replaying a backlog
    clock.set_lag({("job.completed", 0): 0, ("job.started", 1): 5000})
    assert clock.now(WALL) == WALL - timedelta(days=30)
    clock.observe("job.started", 1, WALL - timedelta(days=29))
    clock.observe("job.started", 1, WALL - timedelta(days=31))  # an older one: no step back
    assert clock.now(WALL) == WALL - timedelta(days=29)


def test_a_lagging_partition_not_read_yet_holds_event_time_at_the_epoch():
    clock = EventClock()
    clock.observe("job.completed", 0, WALL)
    clock.set_lag({("job.completed", 0): 0, ("job.failed", 2): 10})
    assert clock.now(WALL) == NOTHING_READ


def test_caught_up_with_a_producer_clock_ahead_event_time_is_the_newest_emission():
    clock = EventClock()
    clock.observe("job.failed", 0, WALL + timedelta(minutes=5))
    clock.set_lag({("job.failed", 0): 0})
    assert clock.now(WALL) == WALL + timedelta(minutes=5)
