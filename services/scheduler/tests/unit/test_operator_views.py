"""The operator's view of the cluster: tiers in policy order with their waits, nodes with the GPUs held."""

from datetime import UTC, datetime, timedelta

import pytest

from whetstone.scheduler.domain.job_data import PlacedPart
from whetstone.scheduler.domain.operator import NodeRow, TierCount, node_loads, tier_loads
from whetstone.scheduler.domain.policy import DEFAULT_TIERS

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)


def test_every_policy_tier_in_rank_order_then_unknown_tiers():
    counts = [TierCount("free", 3, 1, NOW - timedelta(minutes=10)), TierCount("legacy", 1, 0, NOW)]
    loads = tier_loads(DEFAULT_TIERS, counts, NOW)
    assert [t.tier for t in loads] == ["premium", "standard", "free", "legacy"]
    free = loads[2]
    assert (free.queued, free.active, free.oldest_wait_s, free.wait_target_s) == (3, 1, 600.0, None)
    assert loads[0].queued == 0 and loads[0].oldest_wait_s is None and loads[0].wait_target_s == 300.0
    assert loads[3].rank is None


def test_nodes_count_the_gpus_their_jobs_hold():
    def node(node_id: str, **kw) -> NodeRow:
        base = dict(gpu_type="a100", gpu_count=8, gpu_memory_gb=80.0, spot=False, schedulable=True,
                    unschedulable_reason=None, lost=False, last_seen=NOW)
        return NodeRow(node_id, **{**base, **kw})

    nodes = [node("n1"), node("n2", schedulable=False, unschedulable_reason="drain"), node("n3", lost=True)]
    held = {"j2": [PlacedPart(node_id="n1", gpu_ids=[2, 3]), PlacedPart(node_id="n2", gpu_ids=[0])],
            "j1": [PlacedPart(node_id="n1", gpu_ids=[0, 1])]}
    loads = {n.node_id: n for n in node_loads(nodes, held)}
    assert (loads["n1"].gpus_in_use, loads["n1"].jobs, loads["n1"].state) == (4, ["j1", "j2"], "ready")
    assert (loads["n2"].gpus_in_use, loads["n2"].state) == (1, "cordoned (drain)")
    assert (loads["n3"].gpus_in_use, loads["n3"].jobs, loads["n3"].state) == (0, [], "lost")
