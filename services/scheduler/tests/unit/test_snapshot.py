"""What the store read (pool nodes, jobs on nodes, queue heads) -> the core's snapshot, and GPU ids for a placement."""

from datetime import UTC, datetime, timedelta

import pytest

from whetstone.scheduler.domain.cluster import ActiveJob, PoolNode, WaitingJob, pick_gpu_ids, to_view
from whetstone.scheduler.domain.job_data import JobResources, PlacedPart, Progress
from whetstone.scheduler.domain.placement import Shape

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def test_rows_become_a_snapshot_with_busy_gpus_and_stopping_victims():
    nodes = [PoolNode("a", "NVIDIA-A100-SXM4-80GB", 8, True, "ib")]
    active = [ActiveJob("r", "free", [PlacedPart(node_id="a", gpu_ids=[0, 1, 2])], NOW - timedelta(hours=1),
                        NOW + timedelta(hours=1), None, Progress(step=50, total_steps=100),
                        NOW - timedelta(seconds=30), 0, NOW - timedelta(hours=3))]
    queued = [WaitingJob("q", "t", "premium", NOW, JobResources(shapes=(Shape("A100", 4, 1),)), 1000.0,
                         Progress(step=25, total_steps=100), spot_preemptions=1)]
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
    one = JobResources(shapes=(Shape("A100", 1),))
    requeued = WaitingJob("r", "t", "free", NOW - timedelta(hours=9), one, 60.0,
                          queued_since=NOW - timedelta(hours=1), waited_s=1800.0)
    first_period = WaitingJob("old", "t", "free", NOW - timedelta(hours=2), one, 60.0)
    view = to_view(NOW, [], [], [requeued, first_period], checkpoint_s=120)
    assert [j.wait(NOW.timestamp()) for j in view.snapshot.queue] == [pytest.approx(5400.0), pytest.approx(7200.0)]


def test_a_gang_meets_at_rank_zero_and_a_single_node_job_needs_no_rendezvous():
    from whetstone.scheduler.domain.placement import rendezvous

    assert rendezvous(["a1"], {"a1": "10.0.0.1"}) == [None]
    parts = rendezvous(["b2", "b1", "b3"], {"b1": "10.0.0.1", "b2": "gpu-b2.internal"})
    assert [p["node_rank"] for p in parts] == [0, 1, 2]
    assert all(p["master_addr"] == "gpu-b2.internal" and p["nodes"] == 3 for p in parts)
    assert all(p["hosts"] == ["gpu-b2.internal", "10.0.0.1", "b3"] for p in parts)  # b3 sent no address
