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
    assert [p.node_rank for p in parts if p] == [0, 1, 2]
    assert all(p and p.master_addr == "gpu-b2.internal" and p.nodes == 3 for p in parts)
    assert all(p and p.hosts == ["gpu-b2.internal", "10.0.0.1", "b3"] for p in parts)  # b3 sent no address
    assert all(p and "master_port" not in p.model_dump(mode="json") for p in parts)  # derived from the segment


# --------------------------------------------- what a node reports of itself (heartbeat free ids, draining)


def _gang_view(*nodes: PoolNode):
    from whetstone.scheduler.domain.policy import cycle

    gang = WaitingJob("g", "t", "standard", NOW, JobResources(shapes=(Shape("cpu", 1, 2),)), 60.0)
    view = to_view(NOW, list(nodes), [], [gang], checkpoint_s=120)
    return view, cycle(view.snapshot)


def test_gpu_ids_a_node_did_not_report_free_are_not_placed_on():
    # node a: 4 GPUs, none held by a job the scheduler placed, but its heartbeat reports only 1 and 3 free
    # (a fenced attempt's process still exiting, work the scheduler does not know of)
    view = to_view(NOW, [PoolNode("a", "cpu", 4, False, "g", free_gpu_ids=(1, 3))], [], [], checkpoint_s=120)
    assert view.snapshot.nodes[0].free == 2
    assert pick_gpu_ids("a", 2, view) == [1, 3]
    # with a job placed on GPU 1 as well, one GPU is left; a node that reports nothing offers what it has
    held = [ActiveJob("r", "free", [PlacedPart(node_id="a", gpu_ids=[1])], NOW, None, None, Progress(), None, 0,
                      NOW)]
    both = to_view(NOW, [PoolNode("a", "cpu", 4, False, "g", free_gpu_ids=(1, 3)),
                         PoolNode("b", "cpu", 4, False, "g")], held, [], checkpoint_s=120)
    assert [n.free for n in both.snapshot.nodes] == [1, 4]
    assert pick_gpu_ids("a", 1, both) == [3]


def test_a_gang_is_not_placed_on_a_draining_node_nor_on_a_node_reporting_its_slot_busy():
    idle = PoolNode("a", "cpu", 1, False, "g", free_gpu_ids=(0,))
    view, result = _gang_view(idle, PoolNode("b", "cpu", 1, False, "g", free_gpu_ids=(0,)))
    assert [dict(a.placement.nodes) for a in result.assignments] == [{"a": 1, "b": 1}]   # the control
    # node b drains (its agent was told to stop): the gang waits, although no job holds b's slot
    view, result = _gang_view(idle, PoolNode("b", "cpu", 1, False, "g", free_gpu_ids=(), draining=True))
    assert result.assignments == [] and [n.free for n in view.snapshot.nodes] == [1, 0]
    # draining wins over a stale free list; and a node whose last heartbeat said its slot is busy
    # (its agent was killed while running: no heartbeat since) gets nothing either
    for b in (PoolNode("b", "cpu", 1, False, "g", free_gpu_ids=(0,), draining=True),
              PoolNode("b", "cpu", 1, False, "g", free_gpu_ids=())):
        assert _gang_view(idle, b)[1].assignments == []
