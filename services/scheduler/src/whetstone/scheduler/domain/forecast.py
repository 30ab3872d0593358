"""Queue positions and estimated starts for the API and the queue view: list scheduling in policy
order on each GPU's estimated free time, using the cycle's own candidate shapes and end estimates."""

from __future__ import annotations

from dataclasses import dataclass

from .policy import Policy, _Cycle, order_queue
from .snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Forecast:
    position: int                        # 1 = next in line
    estimated_start: float | None        # None: nothing in the pool can hold it


def forecast(snapshot: Snapshot, policy: Policy | None = None, limit: int = 200) -> dict[str, Forecast]:
    """Queue position and estimated start of the first ``limit`` queued jobs: list scheduling in
    policy order on each GPU's estimated free time (no backfilling, so a cautious estimate)."""
    policy = policy or Policy()
    c = _Cycle(snapshot, policy)
    slots: dict[str, list[float]] = {n.node_id: [c.now] * n.free for n in snapshot.nodes}
    for r in c.running:
        for n, g in r.nodes:
            if n in slots:
                slots[n].extend([c.end_of(r)] * g)
    for s in slots.values():
        s.sort()
    out: dict[str, Forecast] = {}
    for pos, job in enumerate(order_queue(snapshot.queue, policy), start=1):
        if pos > limit:
            out[job.job_id] = Forecast(pos, None)
            continue
        best: tuple[float, list[str], int] | None = None
        for pool, shape in c.candidates(job):
            g, k = shape.gpus_per_node, shape.nodes
            by_group: dict[str, list[tuple[float, str]]] = {}
            for n in pool.nodes:
                if len(slots[n]) >= g:
                    by_group.setdefault(pool.nodes[n].group, []).append((slots[n][g - 1], n))
            for members in by_group.values():
                if len(members) >= k:
                    members.sort()
                    start = max(c.now, members[k - 1][0])
                    if best is None or start < best[0]:
                        best = (start, [n for _, n in members[:k]], g)
        if best is None:
            out[job.job_id] = Forecast(pos, None)
            continue
        start, chosen, g = best
        for n in chosen:
            slots[n] = sorted(slots[n][g:] + [start + job.est_runtime_s] * g)
        out[job.job_id] = Forecast(pos, start)
    return out
