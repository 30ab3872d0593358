"""The simulator drives the same pure cycle; on small traces the policy beats FIFO and keeps targets."""

import copy

import pytest

from whetstone.scheduler.domain.policy import Policy
from whetstone.devstack.scheduler_sim import traces
from whetstone.devstack.scheduler_sim.simulator import SimConfig, SimJob, SimNode, Simulator, percentile

pytestmark = pytest.mark.unit


def simulate(nodes, jobs, policy, **cfg):
    return Simulator(nodes, copy.deepcopy(jobs), policy, SimConfig(**cfg)).run()


def test_small_load90_trace_ours_beats_fifo():
    nodes, jobs = traces.load90(seed=3, jobs=400)
    ours, fifo = simulate(nodes, jobs, Policy()), simulate(nodes, jobs, Policy.fifo())
    assert ours.unfinished == fifo.unfinished == 0
    assert ours.utilization > fifo.utilization
    assert sum(ours.waits()) < sum(fifo.waits())
    assert percentile(ours.waits("premium"), 99) <= 300 + Policy().checkpoint_s


def test_simulation_is_deterministic_for_a_seed():
    nodes, jobs = traces.seed_week(seed=5, days=1, per_day=150)
    a = simulate(nodes, jobs, Policy(), spot_rate_per_node_hour=0.05, seed=5)
    b = simulate(nodes, jobs, Policy(), spot_rate_per_node_hour=0.05, seed=5)
    assert [j.waited_s for j in a.jobs] == [j.waited_s for j in b.jobs]
    assert a.preemptions == b.preemptions and a.preemptions["spot_loss"] > 0


def test_spot_loss_requeues_and_the_job_still_finishes():
    nodes = [SimNode("spot", "A100", 8, True, "g"), SimNode("od", "A100", 8, False, "g")]
    job = SimJob("j", "standard", 0.0, traces.gpu_shapes(8, 8, ("A100",)), 10 * 3600.0, 10 * 3600.0)
    r = simulate(nodes, [job], Policy(), spot_rate_per_node_hour=0.5, seed=1)
    (done,) = r.jobs
    assert done.finished is not None and done.spot_preemptions >= 1
    # after K spot preemptions a standard job prefers on-demand, so it is not preempted more than K times
    assert done.spot_preemptions <= Policy().spot_fallback_after
    assert r.lost_gpu_s > 0


def test_premium_preemption_keeps_the_victim_priority_and_progress():
    nodes = [SimNode("n", "A100", 8, False, "g")]
    free = SimJob("free", "free", 0.0, traces.gpu_shapes(8, 8, ("A100",)), 4 * 3600.0, 4 * 3600.0)
    prem = SimJob("prem", "premium", 3600.0, traces.gpu_shapes(8, 8, ("A100",)), 600.0, 600.0)
    r = simulate(nodes, [free, prem], Policy())
    by_id = {j.job_id: j for j in r.jobs}
    assert by_id["prem"].waited_s == pytest.approx(Policy().checkpoint_s)
    assert by_id["free"].priority_preemptions == 1
    # the victim resumed from its emergency checkpoint (written in its last 120 s): after the premium
    # job's 600 s it only has the rest of its 4 h to do
    assert by_id["free"].finished == pytest.approx(3600 + 120 + 600 + (4 * 3600 - 3600))
    assert r.lost_gpu_s == pytest.approx(8 * 120)


def test_big_snapshot_cycle_makes_many_decisions():
    from whetstone.scheduler.domain.policy import cycle
    snap = traces.big_snapshot(nodes=100, queued=1000)
    result = cycle(snap)
    assert result.decisions >= 1000 and result.assignments
