"""Discrete-event simulator driving the scheduler's pure core (`domain.policy.cycle`).

Virtual clock; events are arrivals, completions, victims stopping after their checkpoint,
spot interruptions (with notice) and spot nodes coming back. After each batch of events
at one instant the simulator builds a `Snapshot`, runs ONE `cycle` and applies its
decisions, as the service's scheduling loop (scheduler/entrypoints/loop.py, `run_cycle`)
does with Postgres and Kafka.

Work model: a job needs ``work_s`` seconds of training on its GPUs; the scheduler only
sees ``est_s`` (off by up to 2x). Periodic checkpoints every ``checkpoint_every_s``; a
victim told to stop writes an emergency checkpoint (``policy.checkpoint_s``), which a
spot interruption's checkpoint survives with probability ``emergency_ok``, else the
job falls back to its last periodic checkpoint. Lost GPU time = GPU-seconds that did
not end up in a durable checkpoint, plus the checkpoint writes themselves.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from whetstone.scheduler.domain.placement import Node, Placement, Shape
from whetstone.scheduler.domain.policy import Policy, cycle
from whetstone.scheduler.domain.snapshot import CycleResult, QueuedJob, RunningJob, Snapshot


@dataclass
class SimNode:
    node_id: str
    gpu_type: str
    gpu_count: int
    spot: bool
    group: str


@dataclass
class SimJob:
    job_id: str
    tier: str
    submit: float
    shapes: tuple[Shape, ...]
    work_s: float                     # true runtime
    est_s: float                      # what the scheduler is told
    tenant_id: str = "t"
    # state
    done_s: float = 0.0               # durable progress
    queued_since: float = 0.0
    waited_s: float = 0.0
    first_start: float | None = None
    finished: float | None = None
    placement: Placement | None = None
    seg_start: float = 0.0
    token: int = 0
    stopping_at: float | None = None
    stop_reason: str = ""
    spot_preemptions: int = 0
    priority_preemptions: int = 0
    gpus: int = 0


@dataclass
class SimConfig:
    spot_rate_per_node_hour: float = 0.0
    spot_notice_s: float = 120.0
    spot_down_s: float = 1800.0
    checkpoint_every_s: float = 1800.0
    emergency_ok: float = 0.9
    seed: int = 0
    max_time_s: float = 90 * 86400.0


@dataclass
class SimResult:
    policy: str
    jobs: list[SimJob]
    gpus: int
    makespan_s: float
    busy_gpu_s: float
    useful_gpu_s: float
    lost_gpu_s: float
    preemptions: dict[str, int]
    cycles: int
    decisions: int
    cycle_seconds: float
    unfinished: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def utilization(self) -> float:
        return self.busy_gpu_s / (self.gpus * self.makespan_s) if self.makespan_s else 0.0

    @property
    def goodput(self) -> float:
        return self.useful_gpu_s / (self.gpus * self.makespan_s) if self.makespan_s else 0.0

    def waits(self, tier: str | None = None) -> list[float]:
        return sorted(j.waited_s for j in self.jobs if (tier is None or j.tier == tier) and j.first_start is not None)


class Simulator:
    def __init__(self, nodes: Sequence[SimNode], jobs: Sequence[SimJob], policy: Policy, config: SimConfig,
                 name: str = "policy") -> None:
        self.policy, self.cfg, self.name = policy, config, name
        self.nodes = {n.node_id: n for n in nodes}
        self.free = {n.node_id: n.gpu_count for n in nodes}
        self.up = {n.node_id: True for n in nodes}
        self.jobs = {j.job_id: j for j in jobs}
        self.queue: dict[str, SimJob] = {}
        self.running: dict[str, SimJob] = {}
        self.events: list[tuple[float, int, str, str, int]] = []
        self.seq = 0
        self.wakeups: set[float] = set()
        self.busy_gpu_s = self.lost_gpu_s = 0.0
        self.preemptions = {"priority": 0, "spot_loss": 0}
        self.cycles = self.decisions = 0
        self.cycle_seconds = 0.0
        self.node_rng = {n.node_id: random.Random(f"{config.seed}:{n.node_id}") for n in nodes if n.spot}
        for j in jobs:
            self.push(j.submit, "arrive", j.job_id)
        if config.spot_rate_per_node_hour > 0:
            for node_id in self.node_rng:
                self.schedule_interrupt(node_id, 0.0)

    # -- events ---------------------------------------------------------------
    def push(self, t: float, kind: str, ref: str, token: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, ref, token))

    def schedule_interrupt(self, node_id: str, after: float) -> None:
        rate = self.cfg.spot_rate_per_node_hour / 3600.0
        self.push(after + self.node_rng[node_id].expovariate(rate), "interrupt", node_id)

    def run(self) -> SimResult:
        first = min((j.submit for j in self.jobs.values()), default=0.0)
        now = first
        while self.events:
            now = self.events[0][0]
            if now - first > self.cfg.max_time_s:
                break
            while self.events and self.events[0][0] == now:
                _, _, kind, ref, token = heapq.heappop(self.events)
                getattr(self, f"on_{kind}")(now, ref, token)
            if self.queue:
                self.schedule(now)
            if not self.queue and not self.running and all(j.finished is not None for j in self.jobs.values()):
                break
        last = max((j.finished for j in self.jobs.values() if j.finished is not None), default=now)
        useful = sum(j.work_s * j.gpus for j in self.jobs.values() if j.finished is not None)
        return SimResult(self.name, list(self.jobs.values()), sum(n.gpu_count for n in self.nodes.values()),
                         last - first, self.busy_gpu_s, useful, self.lost_gpu_s, dict(self.preemptions),
                         self.cycles, self.decisions, self.cycle_seconds,
                         unfinished=sum(j.finished is None for j in self.jobs.values()))

    def on_arrive(self, now: float, job_id: str, _token: int) -> None:
        job = self.jobs[job_id]
        job.queued_since = now
        self.queue[job_id] = job

    def on_wake(self, now: float, _ref: str, _token: int) -> None:
        self.wakeups.discard(now)

    def on_finish(self, now: float, job_id: str, token: int) -> None:
        job = self.jobs[job_id]
        if token != job.token or job.placement is None:
            return
        job.done_s = job.work_s
        job.finished = now
        self.end_segment(job, now)

    def on_stop(self, now: float, job_id: str, token: int) -> None:
        """A victim (priority) or a job on an interrupted spot node stops after its emergency checkpoint."""
        job = self.jobs[job_id]
        if token != job.token or job.placement is None:
            return
        ran = now - job.seg_start
        ckpt = min(self.policy.checkpoint_s, ran)
        ok = job.stop_reason == "priority" or \
            random.Random(f"{self.cfg.seed}:{job_id}:{job.token}").random() < self.cfg.emergency_ok
        saved = ran - ckpt if ok else math.floor(ran / self.cfg.checkpoint_every_s) * self.cfg.checkpoint_every_s
        job.done_s = min(job.work_s, job.done_s + saved)
        self.lost_gpu_s += job.placement.gpus * (ran - saved)
        self.preemptions[job.stop_reason] += 1
        if job.stop_reason == "priority":
            job.priority_preemptions += 1
        else:
            job.spot_preemptions += 1
        self.end_segment(job, now)
        job.queued_since = now
        self.queue[job_id] = job          # same job, original queue time: priority kept

    def on_interrupt(self, now: float, node_id: str, _token: int) -> None:
        if not self.up[node_id]:
            return
        self.up[node_id] = False          # no new placements; gone after the notice
        stop_at = now + min(self.cfg.spot_notice_s, self.policy.checkpoint_s)
        for job in list(self.running.values()):
            if job.placement and any(n == node_id for n, _ in job.placement.nodes) and job.stopping_at is None:
                job.stopping_at, job.stop_reason = stop_at, "spot_loss"
                self.push(stop_at, "stop", job.job_id, job.token)
        self.push(now + self.cfg.spot_down_s, "back", node_id)

    def on_back(self, now: float, node_id: str, _token: int) -> None:
        self.up[node_id] = True
        self.free[node_id] = self.nodes[node_id].gpu_count
        self.schedule_interrupt(node_id, now)

    def end_segment(self, job: SimJob, now: float) -> None:
        assert job.placement is not None
        self.busy_gpu_s += job.placement.gpus * (now - job.seg_start)
        for node_id, gpus in job.placement.nodes:
            if self.up[node_id]:
                self.free[node_id] += gpus
        job.placement, job.stopping_at = None, None
        job.token += 1
        self.running.pop(job.job_id, None)

    # -- the scheduling cycle ----------------------------------------------------
    def snapshot(self, now: float) -> Snapshot:
        nodes = [Node(n.node_id, n.gpu_type, n.gpu_count, self.free[n.node_id], n.spot, n.group)
                 for n in self.nodes.values() if self.up[n.node_id]]
        running = []
        for j in self.running.values():
            assert j.placement is not None
            remaining_est = j.est_s * (1 - j.done_s / j.work_s)
            periodic = math.floor((now - j.seg_start) / self.cfg.checkpoint_every_s) * self.cfg.checkpoint_every_s
            running.append(RunningJob(j.job_id, j.tier, j.placement.nodes, j.seg_start, j.seg_start + remaining_est,
                                      j.seg_start + periodic, j.done_s / j.work_s, j.stopping_at,
                                      j.priority_preemptions, j.submit))
        queue = [QueuedJob(j.job_id, j.tier, j.submit, j.shapes, j.est_s * (1 - j.done_s / j.work_s),
                           j.spot_preemptions, j.tenant_id, j.waited_s + now - j.queued_since)
                 for j in self.queue.values()]
        return Snapshot(now, nodes, running, queue)

    def schedule(self, now: float) -> None:
        snap = self.snapshot(now)
        began = time.perf_counter()
        result = cycle(snap, self.policy)
        self.cycle_seconds += time.perf_counter() - began
        self.cycles += 1
        self.decisions += result.decisions
        self.apply(now, result)

    def apply(self, now: float, result: CycleResult) -> None:
        for v in result.preemptions:
            job = self.jobs[v.job_id]
            if job.placement is not None and job.stopping_at is None:
                job.stopping_at, job.stop_reason = v.stop_by, "priority"
                self.push(v.stop_by, "stop", job.job_id, job.token)
        for a in result.assignments:
            job = self.queue.pop(a.job_id)
            for node_id, gpus in a.placement.nodes:
                self.free[node_id] -= gpus
                assert self.free[node_id] >= 0, "placement over capacity"
            job.placement, job.seg_start, job.gpus = a.placement, now, a.placement.gpus
            job.waited_s += now - job.queued_since
            if job.first_start is None:
                job.first_start = now
            self.running[job.job_id] = job
            self.push(now + (job.work_s - job.done_s), "finish", job.job_id, job.token)
        if result.wakeup_at is not None and result.wakeup_at not in self.wakeups:
            self.wakeups.add(result.wakeup_at)
            self.push(result.wakeup_at, "wake", "")


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]
