"""The cluster as the scheduling cycle sees it, and gang placement on it. Pure.

Nodes are grouped into pools (GPU type x spot/on-demand). A pool indexes its nodes by
free GPU count so best-fit (the fullest node that still fits: keeps big holes for big
jobs) costs O(GPUs per node), not O(nodes). A gang asks for ``nodes`` x ``gpus_per_node``
all at once; more than one node only inside one interconnect group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from whetstone.contracts import Rendezvous

PoolKey = tuple[str, bool]           # (gpu_type, spot)
Allowed = Callable[[str, int], bool]  # may this node give this many GPUs to the job being placed?


@dataclass(slots=True)
class Node:
    node_id: str
    gpu_type: str
    gpu_count: int
    free: int = -1                   # GPUs no running job holds; -1 = all
    spot: bool = False
    group: str = "default"           # interconnect group (NVLink / InfiniBand island)

    def __post_init__(self) -> None:
        if self.free < 0:
            self.free = self.gpu_count

    @property
    def pool(self) -> PoolKey:
        return (self.gpu_type, self.spot)


@dataclass(frozen=True, slots=True)
class Shape:
    gpu_type: str
    gpus_per_node: int
    nodes: int = 1

    @property
    def total(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True, slots=True)
class Placement:
    shape: Shape
    spot: bool
    nodes: tuple[tuple[str, int], ...]      # (node_id, GPUs taken there)

    @property
    def gpus(self) -> int:
        return sum(g for _, g in self.nodes)


class Pool:
    """The nodes of one GPU type and capacity class, bucketed by free GPUs."""

    def __init__(self, key: PoolKey, nodes: Iterable[Node]) -> None:
        self.key = key
        self.nodes: dict[str, Node] = {}
        self.free: dict[str, int] = {}
        size = 0
        for n in nodes:
            self.nodes[n.node_id] = n
            self.free[n.node_id] = n.free
            size = max(size, n.gpu_count)
        self.node_size = size
        self.buckets: list[dict[str, None]] = [{} for _ in range(size + 1)]
        for node_id in sorted(self.nodes):
            self.buckets[self.free[node_id]][node_id] = None

    def set_free(self, node_id: str, free: int) -> None:
        old = self.free[node_id]
        if old != free:
            del self.buckets[old][node_id]
            self.buckets[free][node_id] = None
            self.free[node_id] = free

    def take(self, node_id: str, gpus: int) -> None:
        self.set_free(node_id, self.free[node_id] - gpus)

    def release(self, node_id: str, gpus: int) -> None:
        self.set_free(node_id, min(self.nodes[node_id].gpu_count, self.free[node_id] + gpus))

    def best_fit(self, gpus: int) -> Iterator[str]:
        """Nodes with at least ``gpus`` free, fullest first."""
        for f in range(gpus, len(self.buckets)):
            yield from self.buckets[f]

    def count_with(self, gpus: int) -> int:
        return sum(len(self.buckets[f]) for f in range(gpus, len(self.buckets)))


def place_single(pool: Pool, gpus: int, allowed: Allowed | None) -> str | None:
    for node_id in pool.best_fit(gpus):
        if allowed is None or allowed(node_id, gpus):
            return node_id
    return None


def place_gang(pool: Pool, shape: Shape, allowed: Allowed | None) -> list[str] | None:
    """``shape.nodes`` nodes of one interconnect group, each with ``gpus_per_node`` free;
    the group left with the least spare capacity on the chosen nodes wins (bin-packing)."""
    g, k = shape.gpus_per_node, shape.nodes
    if pool.count_with(g) < k:
        return None
    by_group: dict[str, list[str]] = {}
    for node_id in pool.best_fit(g):
        if allowed is None or allowed(node_id, g):
            by_group.setdefault(pool.nodes[node_id].group, []).append(node_id)
    best: tuple[int, str] | None = None
    for group, members in by_group.items():
        if len(members) >= k:
            spare = sum(pool.free[n] for n in members[:k]) - g * k
            if best is None or (spare, group) < best:
                best = (spare, group)
    return by_group[best[1]][:k] if best else None


def place(pool: Pool, shape: Shape, allowed: Allowed | None = None) -> Placement | None:
    if shape.nodes == 1:
        node_id = place_single(pool, shape.gpus_per_node, allowed)
        return Placement(shape, pool.key[1], ((node_id, shape.gpus_per_node),)) if node_id else None
    nodes = place_gang(pool, shape, allowed)
    return Placement(shape, pool.key[1], tuple((n, shape.gpus_per_node) for n in nodes)) if nodes else None


def build_pools(nodes: Iterable[Node]) -> dict[PoolKey, Pool]:
    grouped: dict[PoolKey, list[Node]] = {}
    for n in nodes:
        grouped.setdefault(n.pool, []).append(n)
    return {k: Pool(k, v) for k, v in grouped.items()}


def could_ever_fit(shape: Shape, nodes: Iterable[Node], spot: bool | None = None) -> bool:
    """Would the shape fit on these nodes if they were all idle (one interconnect group for gangs)?"""
    per_group: dict[str, int] = {}
    for n in nodes:
        if n.gpu_type == shape.gpu_type and (spot is None or n.spot == spot) and n.gpu_count >= shape.gpus_per_node:
            per_group[n.group] = per_group.get(n.group, 0) + 1
    return any(c >= shape.nodes for c in per_group.values())


def rendezvous(node_ids: Sequence[str], addresses: Mapping[str, str | None]) -> list[Rendezvous | None]:
    """Each gang member's part of a multi-node assignment, by rank in placement order: rank 0
    hosts the rendezvous; a node that never reported an address is reached by its node id.
    The port is left out: every member derives the same one from the segment id."""
    if len(node_ids) < 2:
        return [None] * len(node_ids)
    hosts = [addresses.get(n) or n for n in node_ids]
    return [Rendezvous(master_addr=hosts[0], node_rank=rank, nodes=len(hosts), hosts=hosts)
            for rank in range(len(hosts))]
