"""What the platform's operator sees of the cluster: the queue by tier and the nodes with the GPUs
their jobs hold. Pure: built from rows the store reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from .job_data import PlacedPart
from .policy import TierPolicy


@dataclass(frozen=True)
class TierCount:
    """Jobs of one tier as the store counts them."""

    tier: str
    queued: int
    active: int                        # provisioning, running or checkpointing
    oldest_queued_at: datetime | None


@dataclass(frozen=True)
class TierLoad:
    tier: str
    rank: int | None                   # 0 is the highest; None for a tier the policy no longer has
    wait_target_s: float | None
    queued: int
    active: int
    oldest_wait_s: float | None        # how long the longest-waiting queued job has waited


@dataclass(frozen=True)
class NodeRow:
    node_id: str
    gpu_type: str
    gpu_count: int
    gpu_memory_gb: float
    spot: bool
    schedulable: bool
    unschedulable_reason: str | None
    lost: bool
    last_seen: datetime


@dataclass(frozen=True)
class NodeLoad:
    node_id: str
    gpu_type: str
    gpu_count: int
    gpus_in_use: int
    gpu_memory_gb: float
    spot: bool
    state: str                         # ready | cordoned (<reason>) | lost
    last_seen: datetime
    jobs: list[str]                    # the jobs holding GPUs there


def tier_loads(tiers: Mapping[str, TierPolicy], counts: Sequence[TierCount], now: datetime) -> list[TierLoad]:
    """Every tier of the policy (empty ones too), then any other tier jobs still carry; highest rank first."""
    by_tier = {c.tier: c for c in counts}
    names = sorted(tiers, key=lambda t: tiers[t].rank) + sorted(set(by_tier) - set(tiers))
    out = []
    for name in names:
        c = by_tier.get(name, TierCount(name, 0, 0, None))
        policy = tiers.get(name)
        out.append(TierLoad(name, policy.rank if policy else None, policy.wait_target_s if policy else None,
                            c.queued, c.active,
                            (now - c.oldest_queued_at).total_seconds() if c.oldest_queued_at else None))
    return out


def node_loads(nodes: Sequence[NodeRow], placements: Mapping[str, Sequence[PlacedPart]]) -> list[NodeLoad]:
    """Each node with the GPU ids that active jobs (`job_id -> placement`) hold on it."""
    held: dict[str, set[int]] = {}
    holders: dict[str, list[str]] = {}
    for job_id, parts in sorted(placements.items()):
        for part in parts:
            held.setdefault(part.node_id, set()).update(part.gpu_ids)
            holders.setdefault(part.node_id, []).append(job_id)
    out = []
    for n in nodes:
        state = "lost" if n.lost else "ready" if n.schedulable else f"cordoned ({n.unschedulable_reason or 'no reason'})"
        out.append(NodeLoad(n.node_id, n.gpu_type, n.gpu_count, len(held.get(n.node_id, ())), n.gpu_memory_gb, n.spot,
                            state, n.last_seen, holders.get(n.node_id, [])))
    return out
