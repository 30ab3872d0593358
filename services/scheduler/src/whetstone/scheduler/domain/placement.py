"""Placement over a snapshot of nodes: which node and GPUs a job gets. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class NodeSnapshot:
    node_id: str
    gpu_type: str
    gpu_ids: tuple[int, ...]          # all slots of the node
    busy_gpu_ids: frozenset[int]      # held by jobs this scheduler placed there
    last_seen: datetime
    spot: bool = False
    interconnect_group: str = "default"

    def free(self) -> list[int]:
        return [g for g in self.gpu_ids if g not in self.busy_gpu_ids]


@dataclass(frozen=True)
class Placement:
    node_id: str
    gpu_ids: tuple[int, ...]


def alive(nodes: Iterable[NodeSnapshot], now: datetime, timeout: timedelta) -> list[NodeSnapshot]:
    return [n for n in nodes if now - n.last_seen <= timeout]


def place(gpu_type: str, gpus: int, nodes: Sequence[NodeSnapshot]) -> Placement | None:
    """Best fit: the node of the right type with the fewest free GPUs that still fit the
    job (keeps big holes for big jobs). Ties by node id for determinism."""
    fitting = [n for n in nodes if n.gpu_type == gpu_type and len(n.free()) >= gpus]
    if not fitting:
        return None
    best = min(fitting, key=lambda n: (len(n.free()), n.node_id))
    return Placement(best.node_id, tuple(best.free()[:gpus]))


def fits_anywhere(gpu_type: str, gpus: int, nodes: Sequence[NodeSnapshot]) -> bool:
    return any(n.gpu_type == gpu_type and len(n.gpu_ids) >= gpus for n in nodes)
