"""Postgres reads behind the operator routes: job counts by tier and the node inventory with the
placements of the jobs on it. Read-only; one store per unit of work."""

from __future__ import annotations

from pydantic import TypeAdapter

from whetstone.runtime.messaging import UnitOfWork

from ..domain import jobs as rules
from ..domain.job_data import PlacedPart
from ..domain.operator import NodeRow, TierCount

ACTIVE = sorted(rules.ACTIVE_ON_NODE)
_PLACEMENT = TypeAdapter(list[PlacedPart])


class OperatorStore:
    def __init__(self, uow: UnitOfWork) -> None:
        self.conn = uow.conn

    async def tier_counts(self) -> list[TierCount]:
        rows = await self.conn.fetch(
            "SELECT tier, count(*) FILTER (WHERE status = 'queued') AS queued,"
            " count(*) FILTER (WHERE status = ANY($1::text[])) AS active,"
            " min(COALESCE(queued_since, queued_at)) FILTER (WHERE status = 'queued') AS oldest_queued_at"
            " FROM jobs WHERE status = 'queued' OR status = ANY($1::text[]) GROUP BY tier", ACTIVE)
        return [TierCount(r["tier"], r["queued"], r["active"], r["oldest_queued_at"]) for r in rows]

    async def nodes(self) -> list[NodeRow]:
        rows = await self.conn.fetch(
            "SELECT node_id, gpu_type, gpu_count, gpu_memory_gb, spot, schedulable, unschedulable_reason, lost,"
            " last_seen FROM nodes ORDER BY lost, node_id")
        return [NodeRow(**dict(r)) for r in rows]

    async def placements(self) -> dict[str, list[PlacedPart]]:
        rows = await self.conn.fetch("SELECT job_id, placement FROM jobs WHERE status = ANY($1::text[])", ACTIVE)
        return {r["job_id"]: _PLACEMENT.validate_json(r["placement"]) if isinstance(r["placement"], str)
                else _PLACEMENT.validate_python(r["placement"]) for r in rows}
