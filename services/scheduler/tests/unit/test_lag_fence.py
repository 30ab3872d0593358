"""A node is declared lost only from heartbeats the scheduler could have seen: never while its
consumer is behind on node.heartbeat, nor when it does not hold that partition."""

import pytest
from whetstone.scheduler.entrypoints.watchers import heartbeats_caught_up

pytestmark = pytest.mark.unit


class Lagging:
    """Stands in for the runtime's lag measurement only (what the consumer reports)."""

    def __init__(self, lag):
        self.lag = lag

    async def measure_lag(self):
        return self.lag


@pytest.mark.parametrize(("lag", "caught_up"), [
    ({("node.heartbeat", 0): 0, ("job.started", 0): 40}, True),   # other topics' lag does not matter
    ({("node.heartbeat", 0): 3}, False),                          # heartbeats waiting: silence unproven
    ({("node.heartbeat", 0): -1}, False),                         # not fetched since assigned
    ({("job.started", 0): 0}, False),                             # another replica holds the heartbeats
    (None, False),                                                # nothing assigned (starting, rebalancing)
])
async def test_loss_needs_a_caught_up_heartbeat_partition(lag, caught_up):
    assert await heartbeats_caught_up(Lagging(lag)) is caught_up
