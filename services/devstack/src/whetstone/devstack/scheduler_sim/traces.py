"""Synthetic traces with a fixed seed: `load90` and `seed_week`, and the big
snapshot used to measure decisions per second."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from whetstone.scheduler.domain.placement import Node, Shape
from whetstone.scheduler.domain.snapshot import QueuedJob, RunningJob, Snapshot
from whetstone.devstack.scheduler_sim.simulator import SimJob, SimNode

TIER_MIX = (("free", 0.6), ("standard", 0.3), ("premium", 0.1))


def pick(rng: random.Random, weighted: Sequence[tuple[object, float]]) -> object:
    x, acc = rng.random(), 0.0
    for value, w in weighted:
        acc += w
        if x < acc:
            return value
    return weighted[-1][0]


def misestimate(rng: random.Random, actual: float) -> float:
    """The runtime the tenant (or the scheduler's model) predicts: off by up to 2x either way."""
    return actual * 2 ** rng.uniform(-1.0, 1.0)


def gpu_shapes(gpus: int, node_size: int, types: Sequence[str]) -> tuple[Shape, ...]:
    per_node, nodes = (gpus, 1) if gpus <= node_size else (node_size, math.ceil(gpus / node_size))
    return tuple(Shape(t, per_node, nodes) for t in types)


# ------------------------------------------------------------------ load90

LOAD90_SIZES = ((1, 0.40), (2, 0.20), (4, 0.17), (8, 0.13), (16, 0.06), (32, 0.04))


def load90(seed: int = 7, jobs: int = 5000, load: float = 0.9) -> tuple[list[SimNode], list[SimJob]]:
    """64 A100s (8 nodes x 8, one interconnect group, on-demand); mixed gang sizes 1..32 GPUs,
    log-normal runtimes (median 40 min), Poisson arrivals at the given offered load."""
    rng = random.Random(seed)
    nodes = [SimNode(f"a100-{i:02d}", "A100", 8, False, "ib-0") for i in range(8)]
    sized = []
    for _ in range(jobs):
        gpus = int(pick(rng, LOAD90_SIZES))
        runtime = min(24 * 3600.0, max(120.0, rng.lognormvariate(math.log(2400), 1.0)))
        sized.append((gpus, runtime))
    mean_work = sum(g * r for g, r in sized) / jobs
    rate = load * 64 / mean_work                      # arrivals per second
    t, out = 0.0, []
    for i, (gpus, runtime) in enumerate(sized):
        t += rng.expovariate(rate)
        tier = str(pick(rng, TIER_MIX))
        out.append(SimJob(f"l{i:05d}", tier, t, gpu_shapes(gpus, 8, ("A100",)), runtime,
                          misestimate(rng, runtime), tenant_id=f"{tier}-{rng.randrange(20)}"))
    return nodes, out


def offered_load(nodes: Sequence[SimNode], jobs: Sequence[SimJob]) -> float:
    span = max(j.submit for j in jobs) - min(j.submit for j in jobs)
    work = sum(j.work_s * j.shapes[0].total for j in jobs)
    return work / (sum(n.gpu_count for n in nodes) * span)


# --------------------------------------------------------------- seed_week

WEEK_CLASSES = (  # (name, GPUs, nominal runtime s, share)
    ("small_lora", 1, 15 * 60.0, 0.70),
    ("medium_lora", 2, 2 * 3600.0, 0.20),
    ("lora_70b", 4, 4 * 3600.0, 0.09),
    ("full_ft", 32, 24 * 3600.0, 0.01),
)


def seed_week_nodes() -> list[SimNode]:
    """40 nodes x 8 GPUs: A100 and H100, half spot; each (type, class) is one interconnect group."""
    nodes = []
    for gpu in ("A100", "H100"):
        for spot in (False, True):
            kind = "spot" if spot else "od"
            nodes += [SimNode(f"{gpu.lower()}-{kind}-{i:02d}", gpu, 8, spot, f"{gpu.lower()}-{kind}")
                      for i in range(10)]
    return nodes


def seed_week(seed: int = 7, days: int = 7, per_day: int = 500) -> tuple[list[SimNode], list[SimJob]]:
    rng = random.Random(seed)
    horizon = days * 86400.0
    arrivals = sorted(rng.uniform(0, horizon) for _ in range(days * per_day))
    jobs = []
    for i, t in enumerate(arrivals):
        name, gpus, nominal, _ = pick(rng, [(c, c[3]) for c in WEEK_CLASSES])  # type: ignore[misc]
        runtime = nominal * rng.lognormvariate(0.0, 0.3)
        tier = str(pick(rng, TIER_MIX))
        jobs.append(SimJob(f"w{i:05d}-{name}", tier, t, gpu_shapes(gpus, 8, ("A100", "H100")), runtime,
                           misestimate(rng, runtime), tenant_id=f"{tier}-{rng.randrange(50)}"))
    return seed_week_nodes(), jobs


# ------------------------------------------------------------ big snapshot


def big_snapshot(seed: int = 7, nodes: int = 1000, queued: int = 10_000, busy: float = 0.9) -> Snapshot:
    """1,000 nodes x 8 GPUs (A100/H100, half spot, 25-node interconnect groups), ~90% busy with
    seed_week-like jobs, and 10,000 queued jobs of the same mix."""
    rng = random.Random(seed)
    now = 30 * 86400.0
    node_list = []
    for i in range(nodes):
        gpu = "A100" if i % 2 == 0 else "H100"
        spot = (i // 2) % 2 == 1
        node_list.append(Node(f"n{i:04d}", gpu, 8, 8, spot, f"{gpu}-{spot}-{i // 100}"))
    running: list[RunningJob] = []
    free = {n.node_id: n.gpu_count for n in node_list}
    target = busy * nodes * 8
    used = 0
    order = list(node_list)
    rng.shuffle(order)
    k = 0
    while used < target:
        node = order[k % len(order)]
        k += 1
        gpus = int(pick(rng, ((1, 0.7), (2, 0.2), (4, 0.1))))
        if free[node.node_id] < gpus:
            if k > 4 * nodes:
                break
            continue
        free[node.node_id] -= gpus
        used += gpus
        started = now - rng.uniform(0, 4 * 3600)
        tier = str(pick(rng, TIER_MIX))
        running.append(RunningJob(f"r{len(running):06d}", tier, ((node.node_id, gpus),), started,
                                  started + rng.uniform(600, 8 * 3600), started + rng.uniform(0, 1800),
                                  rng.random()))
    for n in node_list:
        n.free = free[n.node_id]
    queue = []
    for i in range(queued):
        _, gpus, nominal, _ = pick(rng, [(c, c[3]) for c in WEEK_CLASSES])  # type: ignore[misc]
        tier = str(pick(rng, TIER_MIX))
        queue.append(QueuedJob(f"q{i:05d}", tier, now - rng.uniform(0, 86400),
                               gpu_shapes(gpus, 8, ("A100", "H100")), misestimate(rng, nominal), 0,
                               f"{tier}-{rng.randrange(200)}"))
    return Snapshot(now, node_list, running, queue)
