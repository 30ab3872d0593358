"""Rows as Postgres returns them -> the core's snapshot, and GPU ids for a placement."""

from datetime import UTC, datetime, timedelta

import pytest

from whetstone.scheduler.domain.cluster import pick_gpu_ids, to_view

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def test_rows_become_a_snapshot_with_busy_gpus_and_stopping_victims():
    nodes = [{"node_id": "a", "gpu_type": "NVIDIA-A100-SXM4-80GB", "gpu_count": 8, "spot": True,
              "interconnect_group": "ib"}]
    active = [{"job_id": "r", "tier": "free", "placement": [{"node_id": "a", "gpu_ids": [0, 1, 2]}],
               "segment_started_at": NOW - timedelta(hours=1), "est_end_at": NOW + timedelta(hours=1),
               "last_checkpoint_at": None, "progress": {"step": 50, "total_steps": 100},
               "preempt_requested_at": NOW - timedelta(seconds=30), "priority_preemptions": 0,
               "queued_at": NOW - timedelta(hours=3)}]
    queued = [{"job_id": "q", "tenant_id": "t", "tier": "premium", "queued_at": NOW,
               "resources": {"shapes": [{"gpu_type": "A100", "gpus_per_node": 4, "nodes": 1}]},
               "estimated_runtime_s": 1000.0, "progress": {"step": 25, "total_steps": 100}, "spot_preemptions": 1}]
    view = to_view(NOW, nodes, active, queued, checkpoint_s=120)
    (node,) = view.snapshot.nodes
    assert (node.gpu_type, node.free, node.spot) == ("A100", 5, True)
    (run,) = view.snapshot.running
    assert run.progress == 0.5 and run.stopping_at == pytest.approx(NOW.timestamp() + 90)
    assert run.queued_at == pytest.approx(NOW.timestamp() - 3 * 3600)
    (job,) = view.snapshot.queue
    assert job.est_runtime_s == pytest.approx(750.0) and job.spot_preemptions == 1
    assert pick_gpu_ids("a", 2, view) == [3, 4] and pick_gpu_ids("a", 3, view) == [5, 6, 7]


def test_a_queued_job_s_wait_counts_its_earlier_periods_and_the_current_one():
    base = {"tenant_id": "t", "tier": "free", "resources": {"gpu_type": "A100", "gpus_per_node": 1},
            "estimated_runtime_s": 60.0, "progress": {}, "spot_preemptions": 0}
    requeued = {**base, "job_id": "r", "queued_at": NOW - timedelta(hours=9),
                "queued_since": NOW - timedelta(hours=1), "waited_s": 1800.0}
    before_migration = {**base, "job_id": "old", "queued_at": NOW - timedelta(hours=2)}   # no such columns yet
    view = to_view(NOW, [], [], [requeued, before_migration], checkpoint_s=120)
    assert [j.wait(NOW.timestamp()) for j in view.snapshot.queue] == [pytest.approx(5400.0), pytest.approx(7200.0)]


def test_a_gang_meets_at_rank_zero_and_a_single_node_job_needs_no_rendezvous():
    from whetstone.scheduler.domain.placement import rendezvous

    assert rendezvous(["a1"], {"a1": "10.0.0.1"}) == [None]
    parts = rendezvous(["b2", "b1", "b3"], {"b1": "10.0.0.1", "b2": "gpu-b2.internal"})
    assert [p["node_rank"] for p in parts] == [0, 1, 2]
    assert all(p["master_addr"] == "gpu-b2.internal" and p["nodes"] == 3 for p in parts)
    assert all(p["hosts"] == ["gpu-b2.internal", "10.0.0.1", "b3"] for p in parts)  # b3 sent no address
