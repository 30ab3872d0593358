"""An operator's decision on a job held for review."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import orjson

from whetstone.contracts.enums import ChargeClass
from whetstone.runtime.service import Runtime

from ..adapters.store import LedgerStore
from ..context import MeteringContext
from ..domain.kinds import ReviewDecision
from ..domain.ledger import Settlement
from ..domain.usage import AuditEvent
from .metering import event_now, lock_and_load, settle_and_write

REVIEWED = "usage.reviewed"


@dataclass(frozen=True)
class Reviewed:
    job_id: str
    decision: ReviewDecision
    reviewer: str
    note: str


@dataclass(frozen=True)
class ReviewRecord:
    """The decision as the audit trail records it: shaped like an envelope, so the audit route reads
    its producer and payload as it does a lifecycle event's."""

    event_id: str
    event_type: str
    occurred_at: str
    producer: str
    tenant_id: str
    key: str
    payload: Reviewed


async def review_job(rt: Runtime[MeteringContext], job_id: str, decision: ReviewDecision, reviewer: str,
                     note: str) -> Settlement | None:
    """Resolve a job held for review: charge it or refund it. The decision is an audit event of
    its own, and its effect on the ledger is reversals and new charges, like any correction.
    None: metering never saw the job; no entries: it holds nothing for review."""
    wall = rt.clock()
    now = await event_now(rt, wall)
    async with rt.uow() as uow:
        store = LedgerStore(uow.conn)
        cache = rt.ctx.state_cache
        states, versions = await lock_and_load(store, [job_id], None, wall, cache)
        if job_id not in states:
            return None
        job, segments = states[job_id]
        held = [s for s in segments if s.billed and s.billed.charge_class == ChargeClass.REVIEW]
        if not held or job.review_decision is not None:
            return Settlement()
        event_id = str(uuid.uuid4())
        record = ReviewRecord(event_id, REVIEWED, wall.isoformat(), rt.name, job.tenant_id, job_id,
                              Reviewed(job_id, decision, reviewer, note))
        await store.record_events([AuditEvent(event_id, REVIEWED, job_id, None, job.tenant_id, wall, wall,
                                              orjson.dumps(record).decode())])
        job.review_decision = decision
        job.add_event(event_id)
        for s in held:
            s.add_event(event_id)
        return await settle_and_write(rt, uow, store, states, versions, now, {job_id},
                                      {(s.job_id, s.segment_id) for s in held}, cache=cache)
