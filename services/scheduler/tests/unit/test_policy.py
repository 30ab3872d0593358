"""The pure scheduling cycle: order, gang placement, bin-packing, EASY backfill, preemption, spot rules."""

import pytest

from whetstone.scheduler.domain.forecast import forecast
from whetstone.scheduler.domain.placement import Node, Shape
from whetstone.scheduler.domain.policy import (
    DEFAULT_TIERS, Policy, QueuedJob, RunningJob, Snapshot, cycle, order_queue,
)

pytestmark = pytest.mark.unit
NOW = 1_000_000.0
H = 3600.0


def q(job_id, tier="standard", waited=0.0, gpus=1, nodes=1, gpu="A100", runtime=H, spot_preemptions=0):
    return QueuedJob(job_id, tier, NOW - waited, (Shape(gpu, gpus, nodes),), runtime, spot_preemptions)


def run(job_id, node, gpus, tier="free", ends_in=H, started_ago=H, ckpt_ago=None, progress=0.5, stopping_at=None):
    return RunningJob(job_id, tier, ((node, gpus),), NOW - started_ago, NOW + ends_in,
                      None if ckpt_ago is None else NOW - ckpt_ago, progress, stopping_at)


def nodes(n, gpus=8, free=None, gpu="A100", spot=False, group="g0", prefix="n"):
    return [Node(f"{prefix}{i}", gpu, gpus, gpus if free is None else free, spot, group) for i in range(n)]


def placed(result):
    return {a.job_id: a.placement.nodes for a in result.assignments}


# ------------------------------------------------------------------- order


def test_tiers_order_the_queue_fifo_inside_a_tier():
    jobs = [q("f1", "free", waited=50), q("s1", "standard", waited=10), q("p1", "premium", waited=1),
            q("s0", "standard", waited=20), q("f0", "free", waited=60)]
    assert [j.job_id for j in order_queue(jobs, Policy())] == ["p1", "s0", "s1", "f0", "f1"]


def test_aging_a_long_waiting_free_job_overtakes_new_standard_jobs():
    gap = DEFAULT_TIERS["standard"].boost_s - DEFAULT_TIERS["free"].boost_s
    old_free, new_std = q("old-free", "free", waited=gap + 60), q("new-std", "standard", waited=0)
    assert [j.job_id for j in order_queue([new_std, old_free], Policy())] == ["old-free", "new-std"]


def test_fifo_policy_ignores_tiers():
    jobs = [q("p", "premium", waited=1), q("f", "free", waited=2)]
    assert [j.job_id for j in order_queue(jobs, Policy.fifo())] == ["f", "p"]


# -------------------------------------------------------------- placement


def test_best_fit_packs_the_fullest_node_that_fits():
    snap = Snapshot(NOW, [Node("empty", "A100", 8, 8), Node("half", "A100", 8, 3), Node("nearly", "A100", 8, 1)],
                    [], [q("j", gpus=2)])
    assert placed(cycle(snap)) == {"j": (("half", 2),)}


def test_gang_takes_all_gpus_at_once_inside_one_interconnect_group():
    cluster = nodes(2, group="ib-a", prefix="a") + nodes(1, group="ib-b", prefix="b") + nodes(1, group="ib-b",
                                                                                               prefix="c")
    snap = Snapshot(NOW, cluster, [], [q("gang", gpus=8, nodes=3)])
    assert cycle(snap).assignments == []          # 2 + 2 nodes, but no group has 3
    snap = Snapshot(NOW, cluster, [], [q("gang", gpus=8, nodes=2)])
    (a,) = cycle(snap).assignments
    groups = {n.node_id: n.group for n in cluster}
    assert len({groups[n] for n, _ in a.placement.nodes}) == 1 and a.placement.gpus == 16


def test_heterogeneous_shapes_fall_back_to_another_gpu_type():
    job = QueuedJob("j", "standard", NOW, (Shape("H100", 4), Shape("A100", 8)), H)
    snap = Snapshot(NOW, nodes(1, gpu="H100", free=2, prefix="h") + nodes(1, gpu="A100", prefix="a"), [], [job])
    (a,) = cycle(snap).assignments
    assert a.placement.shape == Shape("A100", 8) and a.placement.nodes == (("a0", 8),)


def test_cpu_node_takes_a_tiny_job():
    snap = Snapshot(NOW, [Node("cpu-1", "cpu", 1)], [], [QueuedJob("tiny", "standard", NOW, (Shape("cpu", 1),), 60)])
    assert placed(cycle(snap)) == {"tiny": (("cpu-1", 1),)}


def test_decisions_never_exceed_capacity():
    snap = Snapshot(NOW, nodes(2, free=3), [], [q(f"j{i}", gpus=2) for i in range(10)])
    result = cycle(snap)
    used = {}
    for a in result.assignments:
        for n, g in a.placement.nodes:
            used[n] = used.get(n, 0) + g
    assert all(v <= 3 for v in used.values()) and len(result.assignments) == 2


# ----------------------------------------------------------------- backfill


def easy_setup(short_runtime):
    """One 8-GPU node: 4 GPUs busy for 1 h. Head wants 8 (must wait 1 h); behind it a 2-GPU job."""
    running = [run("r", "n0", 4, ends_in=H)]
    queue = [q("head", "standard", waited=100, gpus=8), q("small", "standard", waited=50, gpus=2,
                                                            runtime=short_runtime)]
    return Snapshot(NOW, nodes(1, free=4), running, queue)


def test_easy_backfill_lets_a_short_job_jump_ahead():
    result = cycle(easy_setup(short_runtime=0.5 * H))
    assert placed(result) == {"small": (("n0", 2),)}
    assert result.assignments[0].backfilled
    (res,) = result.reservations
    assert res.job_id == "head" and res.start == pytest.approx(NOW + H)


def test_easy_backfill_refuses_a_job_that_would_delay_the_reservation():
    result = cycle(easy_setup(short_runtime=2 * H))
    assert result.assignments == [] and result.reservations[0].job_id == "head"


def test_backfill_may_use_gpus_the_reservation_does_not_need():
    # two nodes; head needs 8 GPUs on one node: n0 frees in 1 h; n1 has 2 GPUs spare forever
    running = [run("r0", "n0", 8, ends_in=H), run("r1", "n1", 6, ends_in=10 * H)]
    queue = [q("head", gpus=8, waited=100), q("long", gpus=2, waited=50, runtime=5 * H)]
    result = cycle(Snapshot(NOW, [Node("n0", "A100", 8, 0), Node("n1", "A100", 8, 2)], running, queue))
    assert placed(result) == {"long": (("n1", 2),)}


def test_fifo_blocks_behind_the_head():
    result = cycle(easy_setup(short_runtime=0.5 * H), Policy.fifo())
    assert result.assignments == [] and result.reservations == []


# ---------------------------------------------------------------- preemption


def full_cluster(victims):
    return Snapshot(NOW, nodes(1, free=0), victims, [q("prem", "premium", gpus=4)])


def test_premium_preempts_the_victims_that_lose_least_work():
    victims = [run("old-ckpt", "n0", 4, ckpt_ago=1500, ends_in=10 * H),
               run("fresh-ckpt", "n0", 2, ckpt_ago=30, ends_in=10 * H),
               run("fresh-ckpt-2", "n0", 2, ckpt_ago=60, ends_in=10 * H)]
    result = cycle(full_cluster(victims))
    assert sorted(p.job_id for p in result.preemptions) == ["fresh-ckpt", "fresh-ckpt-2"]
    assert all(p.for_job_id == "prem" and p.reason == "priority" for p in result.preemptions)
    hold = next(r for r in result.reservations if r.job_id == "prem")
    assert hold.kind == "hold" and hold.start == pytest.approx(NOW + Policy().checkpoint_s)


def test_among_equal_victims_premium_preempts_the_one_that_has_been_in_the_system_least():
    # same GPUs, checkpoint and tier: the one queued 20 h ago (it waited long for these GPUs)
    # is spared; the one queued 1 h ago is pushed back instead
    def aged(job_id, queued_ago):
        r = run(job_id, "n0", 4, ckpt_ago=60, ends_in=10 * H)
        r.queued_at = NOW - queued_ago
        return r
    victims = [aged("queued-20h-ago", 20 * H), aged("queued-1h-ago", H)]
    snap = Snapshot(NOW, nodes(1, free=0), victims, [q("prem", "premium", gpus=4)])
    assert [p.job_id for p in cycle(snap).preemptions] == ["queued-1h-ago"]
    # without the age weight both cost the same and the tie goes the other way
    flat = cycle(snap, Policy(victim_age_weight=0.0))
    assert [p.job_id for p in flat.preemptions] == ["queued-20h-ago"]


def test_the_second_blocked_gang_is_protected_from_backfill_too():
    # one group of four nodes: n0, n1 free up in 1 h (gang-a's place), n2, n3 in 2 h with one
    # GPU spare each (gang-b's place). A 10-hour 1-GPU job fits on n2 or n3 now. With one
    # reservation (EASY) only gang-a is protected and the small job delays gang-b by 10 h;
    # with several, gang-b's nodes are reserved too and the small job waits.
    running = [run("r0", "n0", 8, ends_in=H), run("r1", "n1", 8, ends_in=H),
               run("r2", "n2", 7, ends_in=2 * H), run("r3", "n3", 7, ends_in=2 * H)]
    queue = [q("gang-a", gpus=8, nodes=2, waited=300), q("gang-b", gpus=8, nodes=2, waited=200),
             q("long-small", gpus=1, waited=100, runtime=10 * H)]
    four = [Node(f"n{i}", "A100", 8, 0 if i < 2 else 1, False, "g0") for i in range(4)]
    snap = Snapshot(NOW, four, running, queue)
    protected = cycle(snap)
    assert {r.job_id: r.start for r in protected.reservations} == {"gang-a": NOW + H, "gang-b": NOW + 2 * H}
    assert protected.assignments == []
    easy = cycle(snap, Policy(reservations=1))
    assert [r.job_id for r in easy.reservations] == ["gang-a"]
    assert [a.job_id for a in easy.assignments] == ["long-small"]


def test_no_preemption_when_the_natural_end_is_within_the_target():
    victims = [run("ending", "n0", 8, ends_in=60.0)]
    result = cycle(full_cluster(victims))
    assert result.preemptions == []
    assert result.reservations[0].job_id == "prem" and result.reservations[0].start == pytest.approx(NOW + 60)


def test_premium_and_victims_already_stopping_are_not_preempted_again():
    victims = [run("p-run", "n0", 4, tier="premium", ends_in=10 * H),
               run("stopping", "n0", 4, ends_in=10 * H, stopping_at=NOW + 60)]
    result = cycle(full_cluster(victims))
    assert result.preemptions == []
    assert result.reservations[0].start == pytest.approx(NOW + 60)     # waits for the one already stopping


def test_standard_does_not_preempt():
    snap = Snapshot(NOW, nodes(1, free=0), [run("v", "n0", 8, ends_in=10 * H)], [q("s", "standard")])
    assert cycle(snap).preemptions == []


def test_preempted_job_held_gpus_are_not_backfilled():
    victims = [run("v", "n0", 8, ckpt_ago=10, ends_in=10 * H)]
    snap = Snapshot(NOW, nodes(1, free=0), victims, [q("prem", "premium", gpus=8), q("free", "free", gpus=8)])
    first = cycle(snap)
    assert [p.job_id for p in first.preemptions] == ["v"]
    # the victim stopped: its GPUs are free; the premium job gets them even though a free job waits longer
    snap = Snapshot(NOW + 120, nodes(1), [], [q("prem", "premium", gpus=8), q("free", "free", gpus=8, waited=5000)])
    assert placed(cycle(snap)) == {"prem": (("n0", 8),)}


# ---------------------------------------------------------------- spot


def spot_and_on_demand():
    return nodes(1, spot=True, prefix="spot") + nodes(1, spot=False, prefix="od")


def test_standard_prefers_spot_then_on_demand_after_k_spot_preemptions():
    snap = Snapshot(NOW, spot_and_on_demand(), [], [q("s", "standard", gpus=2)])
    assert placed(cycle(snap)) == {"s": (("spot0", 2),)}
    snap = Snapshot(NOW, spot_and_on_demand(), [], [q("s", "standard", gpus=2, spot_preemptions=2)])
    assert placed(cycle(snap)) == {"s": (("od0", 2),)}


def test_free_tier_keeps_to_spot_after_preemptions_but_falls_back_when_spot_is_full():
    snap = Snapshot(NOW, spot_and_on_demand(), [], [q("f", "free", gpus=2, spot_preemptions=5)])
    assert placed(cycle(snap)) == {"f": (("spot0", 2),)}
    full_spot = [Node("spot0", "A100", 8, 0, True, "g0"), Node("od0", "A100", 8, 8, False, "g0")]
    snap = Snapshot(NOW, full_spot, [run("x", "spot0", 8)], [q("f", "free", gpus=2)])
    assert placed(cycle(snap)) == {"f": (("od0", 2),)}


def test_premium_prefers_on_demand():
    snap = Snapshot(NOW, spot_and_on_demand(), [], [q("p", "premium", gpus=2)])
    assert placed(cycle(snap)) == {"p": (("od0", 2),)}


# ------------------------------------------------------------------ forecast


def test_forecast_gives_positions_and_start_times_in_order():
    running = [run("r", "n0", 8, ends_in=H)]
    queue = [q("a", "standard", waited=20, gpus=8, runtime=2 * H), q("b", "standard", waited=10, gpus=8)]
    f = forecast(Snapshot(NOW, nodes(1, free=0), running, queue))
    assert (f["a"].position, f["b"].position) == (1, 2)
    assert f["a"].estimated_start == pytest.approx(NOW + H)
    assert f["b"].estimated_start == pytest.approx(NOW + 3 * H)


def test_forecast_has_no_start_for_a_job_nothing_can_hold():
    f = forecast(Snapshot(NOW, nodes(1), [], [q("big", gpus=8, nodes=4)]))
    assert f["big"].estimated_start is None and f["big"].position == 1


def test_cycle_is_pure():
    snap = easy_setup(short_runtime=0.5 * H)
    before = [(n.node_id, n.free) for n in snap.nodes]
    assert placed(cycle(snap)) == placed(cycle(snap))
    assert [(n.node_id, n.free) for n in snap.nodes] == before


# --------------------------------------------------------- overdue guard


def test_an_overdue_job_is_served_before_the_tier_order():
    # the free job has waited 4.5 h (past 4 h and 0.3x the 2 h the cluster needs for its work); the
    # standard job, queued 3 h ago, is ahead of it by its tier's head start. One node: one of them.
    snap = Snapshot(NOW, nodes(1), [], [q("std", "standard", gpus=8, waited=3 * H),
                                        q("free-late", "free", gpus=8, waited=4.5 * H)])
    assert list(placed(cycle(snap))) == ["free-late"]
    assert list(placed(cycle(snap, Policy(overdue_after_s=None)))) == ["std"]


def test_premium_preemption_spares_the_nodes_an_overdue_job_waits_for():
    # n0 frees in 1 h: the overdue free job's place. Its running job is the cheaper victim (just
    # checkpointed), so without the guard premium takes n0 and the overdue job waits another 3 h
    # for n1; with it, premium preempts on n1 and the overdue job keeps its reservation on n0.
    running = [run("on-n0", "n0", 8, ends_in=H, ckpt_ago=60), run("on-n1", "n1", 8, ends_in=3 * H, ckpt_ago=1800)]
    queue = [q("prem", "premium", gpus=8), q("late", "free", gpus=8, waited=5 * H)]
    snap = Snapshot(NOW, nodes(2, free=0), running, queue)
    guarded = cycle(snap)
    assert [p.job_id for p in guarded.preemptions] == ["on-n1"]
    late = next(r for r in guarded.reservations if r.job_id == "late")
    assert list(late.nodes) == ["n0"] and late.start == pytest.approx(NOW + H)
    unguarded = cycle(snap, Policy(overdue_after_s=None))
    assert [p.job_id for p in unguarded.preemptions] == ["on-n0"]


def test_the_guard_waits_longer_when_the_whole_cluster_is_backed_up():
    # 5 h of waiting is not overdue when the queued work alone needs 20 h of the cluster
    backlog = [q(f"b{i}", "free", gpus=8, runtime=10 * H, waited=60.0 * i) for i in range(16)]
    snap = Snapshot(NOW, nodes(8, free=0), [run(f"r{i}", f"n{i}", 8, ends_in=10 * H) for i in range(8)],
                    [*backlog, q("std", "standard", gpus=8, waited=4 * H), q("late", "free", gpus=8, waited=5 * H)])
    reservations = [r.job_id for r in cycle(snap).reservations]
    assert reservations[0] != "late"
    quiet = Snapshot(NOW, snap.nodes, snap.running, [q("std", "standard", gpus=8, waited=4 * H),
                                                     q("late", "free", gpus=8, waited=5 * H)])
    assert [r.job_id for r in cycle(quiet).reservations][0] == "late"
