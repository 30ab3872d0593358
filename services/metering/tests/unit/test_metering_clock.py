"""Event time: held back by lagging partitions, running with the wall clock once caught up."""

from datetime import UTC, datetime, timedelta

import pytest

from whetstone.metering.domain.clock import NOTHING_READ, EventClock

pytestmark = pytest.mark.unit
WALL = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def test_caught_up_event_time_is_the_wall_clock():
    clock = EventClock()
    clock.set_lag({("job.started", 0): 0})
    assert clock.now(WALL) == WALL
    clock.observe("job.started", 0, WALL - timedelta(days=3), WALL)
    clock.set_lag({("job.started", 0): 0})
    assert clock.now(WALL) == WALL


def test_a_lagging_partition_holds_event_time_at_the_newest_it_delivered():
    clock = EventClock()
    clock.observe("job.completed", 0, WALL - timedelta(minutes=1), WALL)
    clock.observe("job.started", 1, WALL - timedelta(days=30), WALL)  # replaying a backlog
    clock.set_lag({("job.completed", 0): 0, ("job.started", 1): 5000})
    assert clock.now(WALL) == WALL - timedelta(days=30)
    clock.observe("job.started", 1, WALL - timedelta(days=29), WALL)
    clock.observe("job.started", 1, WALL - timedelta(days=31), WALL)  # an older one: no step back
    assert clock.now(WALL) == WALL - timedelta(days=29)


def test_a_lagging_partition_not_read_yet_holds_event_time_at_the_epoch():
    clock = EventClock()
    clock.observe("job.completed", 0, WALL, WALL)
    clock.set_lag({("job.completed", 0): 0, ("job.failed", 2): 10})
    assert clock.now(WALL) == NOTHING_READ


def test_events_from_a_clock_ahead_do_not_freeze_event_time():
    clock = EventClock()
    ahead = WALL + timedelta(days=20)
    clock.observe("job.failed", 0, ahead, WALL)
    clock.set_lag({("job.failed", 0): 0})
    assert clock.now(WALL) == ahead
    assert clock.now(WALL + 3 * S) == ahead + 3 * S  # grace periods still run out


@pytest.mark.parametrize("lag", [None, {}, {("job.started", 0): 0, ("job.started", 1): -1}])
def test_an_unknown_lag_decides_nothing_by_time(lag):
    """A consumer that has not seen where its partitions stand (just started, mid-rebalance,
    a partition not fetched since it was assigned) must not close anything by the wall clock."""
    clock = EventClock()
    assert clock.now(WALL) == NOTHING_READ  # nothing measured yet
    clock.observe("job.started", 0, WALL - timedelta(days=2), WALL)
    clock.set_lag(lag)
    assert clock.now(WALL) == NOTHING_READ
    clock.set_lag({("job.started", 0): 0, ("job.started", 1): 0})
    assert clock.now(WALL) == WALL


def test_a_restarted_consumer_runs_on_from_where_the_service_had_got():
    """A killed replica handled the newest events (stamped by a clock days ahead); its successor reads
    only a few older ones. Once caught up it runs on from the service's newest recorded event, not from
    those few: a job that ended last would otherwise wait days of wall time for event time to reach it."""
    clock = EventClock()
    recorded = WALL + timedelta(days=8)       # the newest event the service handled before the restart
    clock.resume(recorded, WALL)
    clock.observe("job.started", 0, WALL + timedelta(days=7), WALL)   # what is left to read is older
    clock.set_lag({("job.started", 0): 0})
    assert clock.now(WALL + 2 * S) == recorded + 2 * S
