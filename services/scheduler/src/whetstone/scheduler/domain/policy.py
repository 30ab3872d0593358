"""The scheduling cycle: a pure function from a snapshot to decisions (as Kueue does it).

    cycle(Snapshot(now, nodes, running, queue), Policy) -> CycleResult

The service builds the snapshot from Postgres and applies the result in one
transaction; the simulator builds it from its own state and applies it to a virtual
clock. Same code, same decisions.

One cycle:

1. Order the queue: priority by tier with aging. A job's sort key is its queue time
   minus its tier's head start (``boost_s``), so FIFO holds inside a tier and a job that
   has waited longer than the head-start gap overtakes newer jobs of the tier above it:
   nothing starves. A re-queued (preempted) job keeps its original queue time.
2. Urgent pass, for tiers that may preempt (premium): a job that fits now is placed. One
   that does not gets the earliest start the running jobs' estimated ends allow; if that
   start would break its wait target, lower-tier victims are chosen to lose the least
   work (recent checkpoint, little progress since), told to checkpoint and stop, and the
   job holds their GPUs (a reservation nobody else may delay). Among victims, a job that
   has been in the system longer (since it was first queued) costs more: pushing back a job
   that already waited long is what makes a tail worse than FIFO's.
   Overdue guard: the job that has waited longest in all (``waited_s``), once past 4 h and 0.3x
   the time the cluster needs for all its work, is overdue: premium preemption spares the nodes
   it will start on if other victims will do, and after the urgent pass it is placed or gets
   the first reservation. (Premium gangs had preempted the jobs on a free gang's next nodes;
   the victims re-queued ahead of it and its wait grew past FIFO's.)
3. Main pass, in order: gang placement (all GPUs at once; several nodes only inside one
   interconnect group) with best-fit bin-packing. The first ``reservations`` (4) jobs that
   do not fit each get a reservation: the earliest time and nodes where they will fit (1
   would be EASY; more protects the gangs behind the head, which otherwise wait for four
   whole nodes to be free at once while small jobs keep backfilling them). Later jobs may
   jump ahead (backfill) only if they do not delay any reservation: they end before it
   starts by their runtime estimate, or use GPUs the reservation does not need.

Spot: tiers that prefer spot try spot pools first; after ``spot_fallback_after`` spot
preemptions, or when no spot capacity fits, they may use on-demand if their tier allows.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from .placement import Allowed, Placement, Pool, PoolKey, Shape, build_pools, could_ever_fit, place
from .snapshot import (  # noqa: F401  (the snapshot and decision types are imported from here too)
    Assignment, CycleResult, Preemption, QueuedJob, Reservation, RunningJob, Snapshot,
)

# ------------------------------------------------------------------ policy

PREFER_SPOT = "prefer_spot"
PREFER_ON_DEMAND = "prefer_on_demand"
WHEN_SPOT_FULL = "when_spot_full"    # on-demand whenever spot has no room for the job now
WHEN_NO_SPOT = "when_no_spot"        # on-demand only if no spot capacity could ever hold the job


@dataclass(frozen=True)
class TierPolicy:
    rank: int                         # 0 is the highest
    boost_s: float                    # head start in the queue order
    wait_target_s: float | None       # queue wait the tier is promised (None: best effort)
    can_preempt: bool = False
    preemptible: bool = True
    spot: str = PREFER_SPOT
    on_demand: str = WHEN_SPOT_FULL
    on_demand_after_k: bool = True       # after K spot preemptions, prefer on-demand


DEFAULT_TIERS: Mapping[str, TierPolicy] = {
    "premium": TierPolicy(0, 6 * 3600.0, 300.0, can_preempt=True, preemptible=False, spot=PREFER_ON_DEMAND),
    "standard": TierPolicy(1, 2 * 3600.0, 3600.0),
    "free": TierPolicy(2, 0.0, None, on_demand_after_k=False),
}


@dataclass(frozen=True)
class Policy:
    tiers: Mapping[str, TierPolicy] = field(default_factory=lambda: dict(DEFAULT_TIERS))
    ordering: str = "priority"           # "priority" (tiers + aging) or "fifo"
    backfill: bool = True                # EASY backfilling; off = strict head-of-line
    preemption: bool = True
    spot_rules: bool = True              # tier spot/on-demand rules; off = any pool
    checkpoint_s: float = 120.0          # a victim's emergency checkpoint and stop
    spot_fallback_after: int = 2         # K: spot preemptions before a job prefers on-demand
    max_priority_preemptions: int = 3    # a job preempted this often for priority is not chosen again
    overrun_s: float = 300.0             # a job past its estimate is assumed to end this much later
    max_urgent: int = 32                 # preempting-tier jobs examined per cycle
    reservations: int = 4                # blocked jobs that get a reservation (1 = EASY)
    victim_age_weight: float = 3.0       # victim cost per GPU-second the victim has been in the system
    overdue_after_s: float | None = 4 * 3600.0   # overdue: waited this long in all (None: no guard) ...
    overdue_drain_factor: float = 0.3    # ... and this fraction of the time the cluster needs for its work
    overdue_max: int = 1                 # overdue jobs served first per cycle (the longest waiting)

    @classmethod
    def fifo(cls) -> Policy:
        """The baseline: one queue in arrival order, head-of-line blocking, no preemption."""
        return cls(ordering="fifo", backfill=False, preemption=False, spot_rules=False, overdue_after_s=None)

    def tier(self, name: str) -> TierPolicy:
        return self.tiers.get(name) or self.tiers["free"]


def sort_key(job: QueuedJob, policy: Policy) -> tuple[float, str]:
    if policy.ordering == "fifo":
        return (job.queued_at, job.job_id)
    return (job.queued_at - policy.tier(job.tier).boost_s, job.job_id)


def order_queue(queue: Iterable[QueuedJob], policy: Policy) -> list[QueuedJob]:
    return sorted(queue, key=lambda j: sort_key(j, policy))


# ------------------------------------------------------------------- cycle


class _Cycle:
    def __init__(self, snap: Snapshot, policy: Policy) -> None:
        self.snap, self.policy, self.now = snap, policy, snap.now
        self.nodes = {n.node_id: n for n in snap.nodes}
        self.pools: dict[PoolKey, Pool] = build_pools(snap.nodes)
        self.spot_types = {n.gpu_type for n in snap.nodes if n.spot}
        self.running = [r for r in snap.running if any(n in self.nodes for n, _ in r.nodes)]
        self.stopping: dict[str, float] = {r.job_id: r.stopping_at for r in self.running if r.stopping_at is not None}
        self.reservations: list[Reservation] = []
        self.reserved: dict[str, int] = {}
        self.result = CycleResult()
        self._releases: list[tuple[float, str, int]] | None = None
        self._on_node: dict[str, list[RunningJob]] | None = None
        self._spot_fit: dict[Shape, bool] = {}
        self.protected: set[str] = set()     # nodes an overdue job will start on: victims elsewhere first

    # -- where a job may run -------------------------------------------------
    def classes(self, job: QueuedJob) -> tuple[bool, ...]:
        """Spot flags of the pools the job may use, preferred first."""
        if not self.policy.spot_rules:
            return (True, False)
        tier = self.policy.tier(job.tier)
        if tier.spot == PREFER_ON_DEMAND:
            return (False, True)
        if tier.on_demand_after_k and job.spot_preemptions >= self.policy.spot_fallback_after:
            return (False, True)
        if tier.on_demand == WHEN_SPOT_FULL:
            return (True, False)
        return (True,) if any(self.spot_can_hold(s) for s in job.shapes) else (False,)

    def spot_can_hold(self, shape: Shape) -> bool:
        known = self._spot_fit.get(shape)
        if known is None:
            known = shape.gpu_type in self.spot_types and could_ever_fit(shape, self.snap.nodes, spot=True)
            self._spot_fit[shape] = known
        return known

    def candidates(self, job: QueuedJob) -> Iterable[tuple[Pool, Shape]]:
        for spot in self.classes(job):
            for shape in job.shapes:
                pool = self.pools.get((shape.gpu_type, spot))
                if pool is not None:
                    yield pool, shape

    # -- reservations --------------------------------------------------------
    def allowed_for(self, end: float) -> Allowed | None:
        """A job holding GPUs until ``end`` must leave every earlier-starting reservation its GPUs."""
        relevant = [r for r in self.reservations if r.start < end]
        if not relevant:
            return None

        def allowed(node_id: str, gpus: int) -> bool:
            return all(gpus <= r.extra[node_id] for r in relevant if node_id in r.nodes)
        return allowed

    def reserve(self, r: Reservation) -> None:
        self.reservations.append(r)
        for n, g in r.nodes.items():
            self.reserved[n] = self.reserved.get(n, 0) + g

    def try_place(self, job: QueuedJob) -> Placement | None:
        end = self.now + job.est_runtime_s
        allowed = self.allowed_for(end)
        for pool, shape in self.candidates(job):
            p = place(pool, shape, allowed)
            if p is not None:
                return p
        return None

    def commit(self, job: QueuedJob, p: Placement, backfilled: bool) -> None:
        pool = self.pools[(p.shape.gpu_type, p.spot)]
        end = self.now + job.est_runtime_s
        for node_id, gpus in p.nodes:
            pool.take(node_id, gpus)
            for r in self.reservations:
                if r.start < end and node_id in r.nodes:
                    r.extra[node_id] -= gpus
        self.result.assignments.append(Assignment(job.job_id, p, backfilled))
        self._add_release(end, p.nodes)

    # -- the future: when do GPUs free up ------------------------------------
    def end_of(self, r: RunningJob) -> float:
        if r.job_id in self.stopping:
            return max(self.stopping[r.job_id], self.now)
        return max(r.est_end, self.now + (self.policy.overrun_s if r.est_end <= self.now else 0.0))

    def releases(self) -> list[tuple[float, str, int]]:
        if self._releases is None:
            rel = [(self.end_of(r), n, g) for r in self.running for n, g in r.nodes if n in self.nodes]
            rel.sort()
            self._releases = rel
        return self._releases

    def _add_release(self, end: float, nodes: Iterable[tuple[str, int]]) -> None:
        if self._releases is not None:
            for n, g in nodes:
                bisect.insort(self._releases, (end, n, g))

    def earliest_fit(self, job: QueuedJob, kind: str) -> Reservation | None:
        best: Reservation | None = None
        for pool, shape in self.candidates(job):
            r = self._earliest_in_pool(job, pool, shape, kind)
            if r is not None and (best is None or r.start < best.start):
                best = r
        return best

    def _earliest_in_pool(self, job: QueuedJob, pool: Pool, shape: Shape, kind: str) -> Reservation | None:
        g, k = shape.gpus_per_node, shape.nodes
        cur = {n: f - self.reserved.get(n, 0) for n, f in pool.free.items()}
        groups: dict[str, set[str]] = {}
        for n, f in cur.items():
            if f >= g:
                groups.setdefault(pool.nodes[n].group, set()).add(n)

        def fit() -> list[str] | None:
            for grp in sorted(groups):
                if len(groups[grp]) >= k:
                    return sorted(groups[grp], key=lambda n: (cur[n], n))[:k]
            return None

        t, chosen = self.now, fit()
        if chosen is None:
            for t, n, gpus in self.releases():
                if n not in cur:
                    continue
                cur[n] += gpus
                if cur[n] >= g:
                    groups.setdefault(pool.nodes[n].group, set()).add(n)
                    if len(groups[pool.nodes[n].group]) >= k:
                        chosen = fit()
                        if chosen is not None:
                            break
        if chosen is None:
            return None
        return Reservation(job.job_id, t, {n: g for n in chosen}, {n: cur[n] - g for n in chosen}, kind)

    # -- preemption ----------------------------------------------------------
    def on_node(self) -> dict[str, list[RunningJob]]:
        if self._on_node is None:
            idx: dict[str, list[RunningJob]] = {}
            for r in self.running:
                for n, _ in r.nodes:
                    idx.setdefault(n, []).append(r)
            self._on_node = idx
        return self._on_node

    def victim_cost(self, r: RunningJob) -> float:
        """GPU-seconds at risk if the emergency checkpoint fails, plus the checkpoint itself;
        higher tiers cost more; the time the victim has been in the system since it was first
        queued (it would wait again); little progress breaks ties (cheap to redo)."""
        since = self.now - (r.last_checkpoint_at if r.last_checkpoint_at is not None else r.started_at)
        weight = 3.0 ** max(0, 2 - self.policy.tier(r.tier).rank)    # free 1, standard 3
        age = self.now - r.queued_at if r.queued_at is not None else 0.0
        return (r.gpus * ((max(since, 0.0) + self.policy.checkpoint_s) * weight
                          + self.policy.victim_age_weight * max(age, 0.0)) + r.progress)

    def preemptible(self, r: RunningJob, for_tier: TierPolicy) -> bool:
        t = self.policy.tier(r.tier)
        return (t.preemptible and t.rank > for_tier.rank and r.job_id not in self.stopping
                and r.priority_preemptions < self.policy.max_priority_preemptions)

    def choose_victims(self, job: QueuedJob) -> tuple[Reservation, list[RunningJob]] | None:
        """Victims off the nodes an overdue job is waiting for, if any will do; else anywhere."""
        return (self._choose_victims(job, self.protected) if self.protected else None) \
            or self._choose_victims(job, frozenset())

    def _choose_victims(self, job: QueuedJob, spare: Set[str]) -> tuple[Reservation, list[RunningJob]] | None:
        tier = self.policy.tier(job.tier)
        stop_by = self.now + self.policy.checkpoint_s
        best: tuple[float, Reservation, list[RunningJob]] | None = None
        for pool, shape in self.candidates(job):
            g, k = shape.gpus_per_node, shape.nodes
            per_node: dict[str, tuple[float, list[RunningJob]]] = {}
            for n in pool.nodes:
                if n in spare:
                    continue
                avail = pool.free[n] - self.reserved.get(n, 0)
                avail += sum(gg for r in self.on_node().get(n, ()) if r.job_id in self.stopping
                             and self.stopping[r.job_id] <= stop_by for nn, gg in r.nodes if nn == n)
                if avail >= g:
                    per_node[n] = (0.0, [])
                    continue
                cost, taken = 0.0, []
                for r in sorted((r for r in self.on_node().get(n, ()) if self.preemptible(r, tier)),
                                key=self.victim_cost):
                    taken.append(r)
                    cost += self.victim_cost(r)
                    avail += sum(gg for nn, gg in r.nodes if nn == n)
                    if avail >= g:
                        per_node[n] = (cost, taken)
                        break
            by_group: dict[str, list[tuple[float, str]]] = {}
            for n, (cost, _) in per_node.items():
                by_group.setdefault(pool.nodes[n].group, []).append((cost, n))
            for members in by_group.values():
                if len(members) < k:
                    continue
                members.sort()
                chosen = [n for _, n in members[:k]]
                victims = list({r.job_id: r for n in chosen for r in per_node[n][1]}.values())
                if not victims:
                    continue   # fits without preemption: the natural reservation covers it
                cost = sum(self.victim_cost(r) for r in victims)
                if best is None or cost < best[0]:
                    res = Reservation(job.job_id, stop_by, {n: g for n in chosen}, {n: 0 for n in chosen}, "hold")
                    best = (cost, res, victims)
        return (best[1], best[2]) if best else None

    def urgent(self, job: QueuedJob, handled: set[str]) -> None:
        tier = self.policy.tier(job.tier)
        p = self.try_place(job)
        if p is not None:
            self.commit(job, p, backfilled=False)
            handled.add(job.job_id)
            return
        deadline = job.queued_at + (tier.wait_target_s or 0.0)
        natural = self.earliest_fit(job, "hold")
        good_enough = max(deadline - self.policy.checkpoint_s, self.now + self.policy.checkpoint_s)
        if natural is not None and natural.start <= good_enough:
            # the running jobs' estimated ends (or victims already stopping) free the GPUs in time;
            # look again then, in case an estimate was optimistic
            self.reserve(natural)
            handled.add(job.job_id)
            self._wake(natural.start + 1.0)
            return
        chosen = self.choose_victims(job)
        if chosen is None:
            if natural is not None:
                self.reserve(natural)
                handled.add(job.job_id)
            return
        res, victims = chosen
        for v in victims:
            self.stopping[v.job_id] = res.start
            since = self.now - (v.last_checkpoint_at if v.last_checkpoint_at is not None else v.started_at)
            self.result.preemptions.append(Preemption(v.job_id, job.job_id, "priority", res.start,
                                                      v.gpus * max(since, 0.0)))
        self._releases = None
        self.reserve(res)
        handled.add(job.job_id)

    def drain_s(self) -> float:
        """How long the cluster needs for all the work it holds (queued and running), by estimates:
        about the longest FIFO would make the last job in line wait."""
        gpus = sum(n.gpu_count for n in self.snap.nodes) or 1
        work = sum(j.est_runtime_s * (j.shapes[0].total if j.shapes else 1) for j in self.snap.queue)
        work += sum(max(self.end_of(r) - self.now, 0.0) * r.gpus for r in self.running)
        return work / gpus

    def late_jobs(self, order: list[QueuedJob]) -> list[QueuedJob]:
        """The jobs that have waited longest in all, once past both thresholds: a fixed one and a
        fraction of the drain time (a busy cluster makes everyone wait; a quiet one should not)."""
        limit = max(self.policy.overdue_after_s or 0.0, self.policy.overdue_drain_factor * self.drain_s())
        late = sorted((j for j in order if j.wait(self.now) >= limit), key=lambda j: -j.wait(self.now))
        return late[: self.policy.overdue_max]

    def protect(self, late: list[QueuedJob]) -> None:
        """The nodes an overdue job will start on: preemption for premium looks elsewhere first, so
        the GPUs it has waited for are not handed to a newcomer (victims re-queue ahead of it)."""
        for job in late:
            r = self.earliest_fit(job, "overdue")
            if r is not None:
                self.protected.update(r.nodes)

    def overdue(self, late: list[QueuedJob], handled: set[str]) -> None:
        """Right after the urgent pass, before anyone else: placed now, or the first reservation."""
        for job in (j for j in late if j.job_id not in handled):
            self.result.decisions += 1
            handled.add(job.job_id)
            p = self.try_place(job)
            if p is not None:
                self.commit(job, p, backfilled=False)
                continue
            r = self.earliest_fit(job, "overdue")
            if r is not None:
                self.reserve(r)

    def _wake(self, t: float) -> None:
        if t > self.now and (self.result.wakeup_at is None or t < self.result.wakeup_at):
            self.result.wakeup_at = t

    # -- the cycle -----------------------------------------------------------
    def run(self) -> CycleResult:
        order = order_queue(self.snap.queue, self.policy)
        self.result.order = [j.job_id for j in order]
        handled: set[str] = set()
        late = self.late_jobs(order) if self.policy.overdue_after_s is not None else []
        self.protect(late)
        if self.policy.preemption:
            urgent = [j for j in order if self.policy.tier(j.tier).can_preempt][: self.policy.max_urgent]
            for job in urgent:
                self.result.decisions += 1
                self.urgent(job, handled)
        self.overdue(late, handled)
        reserved = 0
        for job in order:
            if job.job_id in handled:
                continue
            self.result.decisions += 1
            p = self.try_place(job)
            if p is not None:
                self.commit(job, p, backfilled=reserved > 0)
                continue
            if not self.policy.backfill:
                break
            if reserved < self.policy.reservations:
                r = self.earliest_fit(job, "easy")
                if r is not None:
                    self.reserve(r)
                    reserved += 1
        self.result.reservations = self.reservations
        return self.result


def cycle(snapshot: Snapshot, policy: Policy | None = None) -> CycleResult:
    """One scheduling cycle over the snapshot. Pure: the snapshot is not modified."""
    return _Cycle(snapshot, policy or Policy()).run()
