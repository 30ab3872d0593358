"""Metering: lifecycle events -> facts -> settled ledger -> usage.metered.

`meter` handles a batch of never-seen events in one transaction (the runtime claimed
them in the inbox in that same transaction): it records them for audit, locks the
state of their jobs, adds the facts, lets the pure domain settle each job, and writes
the new ledger entries, their usage.metered events (outbox), anomalies and roll-ups.
The per-message handler (entrypoints/handlers.py) calls it on a batch of one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from annotated_types import MaxLen

from whetstone.contracts import (
    Envelope, Event, JobCancelledV1, JobCompletedV1, JobFailedV1, JobPreemptedV1, JobQueuedV1, JobStartedV1,
    UsageMeteredV1, topic_for,
)
from whetstone.contracts.base import new_trace_id, utcnow
from whetstone.contracts.enums import UsageScope
from whetstone.runtime.batching import Delivery
from whetstone.runtime.delivery import PoisonMessage
from whetstone.runtime.messaging import UnitOfWork, current_envelope, encode
from whetstone.runtime.service import Runtime

from ..adapters.cache import State, StateCache
from ..adapters.store import LedgerStore
from ..config import MeteringSettings
from ..context import MeteringContext
from ..domain.billing import Start, Stop
from ..domain.kinds import EntryKind, StopKind, TerminalKind
from ..domain.ledger import Entry, JobState, Policy, Queued, SegmentState, Settlement, Terminal, settle
from ..domain.usage import AuditEvent


def policy_for(config: MeteringSettings, tenants: Mapping[str, str]) -> Policy:
    """The billing policy: the tenants' tiers (platform settings) and the service's grace periods."""
    return Policy(tiers=dict(tenants), orphan_grace=timedelta(seconds=config.orphan_grace_s),
                  close_grace=timedelta(seconds=config.close_grace_s))


def utc(ts: datetime) -> datetime:
    return (ts if ts.tzinfo else ts.replace(tzinfo=UTC)).astimezone(UTC)


# the lifecycle events that change what a job costs
METERED = (JobQueuedV1, JobStartedV1, JobPreemptedV1, JobCompletedV1, JobFailedV1, JobCancelledV1)
METERED_TOPICS = tuple(topic_for(event).name for event in METERED)


@dataclass(frozen=True)
class Fact:
    """What one event adds to its job and segment."""

    job_id: str
    tenant_id: str
    segment_id: str | None
    row: AuditEvent
    start: Start | None = None
    stop: Stop | None = None
    queued: Queued | None = None
    terminal: Terminal | None = None


def fact_of(env: Envelope, ev: Event, raw: bytes, received_at: datetime, event_id: str | None = None) -> Fact:
    eid = event_id or str(env.event_id)
    emitted = utc(env.occurred_at)
    if not isinstance(ev, METERED):
        raise TypeError(f"metering does not handle {ev.EVENT_TYPE}")
    seg = None if isinstance(ev, JobQueuedV1 | JobCancelledV1) else ev.segment_id
    row = AuditEvent(eid, ev.EVENT_TYPE, ev.job_id, seg, env.tenant_id, emitted, received_at,
                   (raw or encode(env)).decode("utf-8", errors="replace"))
    start = stop = queued = terminal = None
    if isinstance(ev, JobStartedV1):
        start = Start(eid, utc(ev.started_at), ev.gpu_type, ev.gpu_count, ev.spot, ev.attempt, ev.node_id)
    elif isinstance(ev, JobPreemptedV1):
        done = utc(ev.checkpointed_at) if ev.checkpointed_at else None
        stop = Stop(eid, StopKind.PREEMPTED, utc(ev.stopped_at), checkpointed_at=done, reason=ev.reason,
                    reported_at=emitted)
    elif isinstance(ev, JobCompletedV1):
        at = utc(ev.stopped_at)
        stop = Stop(eid, StopKind.COMPLETED, at, reported_at=emitted)
        terminal = Terminal(eid, TerminalKind.COMPLETED, at, seg, reported_at=emitted)
    elif isinstance(ev, JobFailedV1):
        at = utc(ev.stopped_at) if ev.stopped_at else emitted
        if seg:
            stop = Stop(eid, StopKind.FAILED, at, error_class=ev.error_class, code=ev.code, reported_at=emitted)
        # a node's cancel report naming its attempt but no segment: that attempt never started (nothing to bill)
        unstarted = ev.attempt if ev.code == "cancelled" and seg is None and ev.node_id else None
        terminal = Terminal(eid, TerminalKind.FAILED, at, seg, ev.error_class, ev.code, emitted,
                            unstarted_attempt=unstarted)
    elif isinstance(ev, JobCancelledV1):
        terminal = Terminal(eid, TerminalKind.CANCELLED, emitted, reported_at=emitted, attempts=ev.attempt)
    else:
        pinned = ev.cost_estimate.price_version if ev.cost_estimate is not None else None
        queued = Queued(eid, emitted, ev.tier, pinned or None)
    return Fact(ev.job_id, env.tenant_id, seg, row, start, stop, queued, terminal)


# -- consuming ----------------------------------------------------------------------------


async def event_now(rt: Runtime[MeteringContext], wall: datetime) -> datetime:
    """Event time, with the consumer's lag measured now (fetched-but-unhandled records count)."""
    clock = rt.ctx.event_clock
    clock.set_lag(await rt.measure_lag())
    return clock.now(wall)


async def resume_event_time(rt: Runtime[MeteringContext]) -> None:
    """Event time goes on from the newest event time a decision recorded before this process started
    waits on (domain/clock.py `resume`)."""
    assert rt.pool is not None, "called once the runtime has its pool (on_start)"
    async with rt.pool.acquire() as conn:
        newest = await LedgerStore(conn).newest_pending_time()
    if newest is not None:
        rt.ctx.event_clock.resume(newest, rt.clock())


async def lock_and_load(store: LedgerStore, job_ids: list[str], tenants: dict[str, str] | None, now: datetime,
                        cache: StateCache | None) -> tuple[dict[str, State], dict[str, int]]:
    """Lock the jobs in id order (creating the missing ones when their tenants are given) and get
    their state, from the cache when it is current. Returns the states and their versions."""
    versions, created = await store.lock_jobs(job_ids, [tenants[j] for j in job_ids] if tenants else None, now)
    states: dict[str, State] = {}
    stale = []
    for job_id in versions:
        hit = cache.take(job_id, versions[job_id]) if cache is not None else None
        if job_id in created and tenants:
            states[job_id] = (JobState(job_id, tenants[job_id], now), [])
        elif hit is not None:
            states[job_id] = hit
        else:
            stale.append(job_id)
    states.update(await store.load(stale))
    return states, versions


def segment_of(state: State, f: Fact, now: datetime) -> SegmentState:
    job, segments = state
    for seg in segments:
        if seg.segment_id == f.segment_id:
            return seg
    assert f.segment_id is not None
    seg = SegmentState(f.segment_id, job.job_id, f.tenant_id, now)
    segments.append(seg)
    segments.sort(key=lambda s: s.segment_id)
    return seg


async def meter(rt: Runtime[MeteringContext], uow: UnitOfWork, deliveries: list[Delivery]) -> None:
    """Meter a batch of never-seen lifecycle events in the caller's transaction."""
    wall = rt.clock()
    clock = rt.ctx.event_clock
    for d in deliveries:
        clock.observe(d.topic, d.partition, utc(d.envelope.occurred_at), wall)
    now = await event_now(rt, wall)
    facts = [fact_of(d.envelope, d.event, d.raw, wall, d.event_id) for d in deliveries]
    traces = {f.job_id: d.envelope.trace_id for f, d in zip(facts, deliveries, strict=True)}
    store = LedgerStore(uow.conn)
    await store.record_events([f.row for f in facts])
    tenants: dict[str, str] = {}
    for f in facts:
        tenants.setdefault(f.job_id, f.tenant_id)
    cache = rt.ctx.state_cache
    states, versions = await lock_and_load(store, sorted(tenants), tenants, wall, cache)
    for f in facts:  # a job's events all name its tenant: another tenant's event is forged or misrouted
        owner = states[f.job_id][0].tenant_id
        if owner != f.tenant_id:
            raise PoisonMessage(f"job {f.job_id} belongs to tenant {owner!r}; an event naming {f.tenant_id!r}"
                                " cannot change its usage", reason="tenant_mismatch")
    touched: dict[str, set[str]] = {}
    repriced: set[str] = set()  # jobs whose own facts changed: all their segments are re-evaluated
    for f in facts:
        job = states[f.job_id][0]
        if f.segment_id is not None:
            seg = segment_of(states[f.job_id], f, wall)
            if f.start:
                seg.see_start(f.start)
            if f.stop:
                seg.see_stop(f.stop)
            touched.setdefault(f.job_id, set()).add(f.segment_id)
        if f.queued:
            job.see_queued(f.queued)
            repriced.add(f.job_id)
        if f.terminal:
            job.see_terminal(f.terminal)
            repriced.add(f.job_id)
    only = {j: (None if j in repriced else touched.get(j, set())) for j in states}
    await settle_and_write(rt, uow, store, states, versions, now, set(states),
                           {(j, s) for j, segs in touched.items() for s in segs}, traces, cache, only)


async def settle_and_write(rt: Runtime[MeteringContext], uow: UnitOfWork, store: LedgerStore, states: dict[str, State],
                           versions: dict[str, int], now: datetime, dirty_jobs: set[str],
                           dirty_segments: set[tuple[str, str]], traces: dict[str, str] | None = None,
                           cache: StateCache | None = None, only: dict[str, set[str] | None] | None = None
                           ) -> Settlement:
    """Settle the jobs, write what changed, and put their state back in the cache."""
    policy = rt.ctx.policy
    assert policy is not None, "bootstrap.on_start binds the policy before any message"
    total = Settlement()
    for job_id in sorted(states):
        job, segments = states[job_id]
        was_closed = job.closed_at
        out = settle(job, segments, now, policy, (only or {}).get(job_id))
        if job.closed_at != was_closed:
            job.closed_at = rt.clock()  # settle decides in event time; record when it happened
        changed = {(e.job_id, e.segment_id) for e in out.entries if e.scope == UsageScope.SEGMENT}
        changed |= {(a.job_id, a.segment_id) for a in out.opened} | {(r[0], r[1]) for r in out.resolved}
        if changed or job.closed_at != was_closed:
            dirty_jobs.add(job_id)
        dirty_segments |= changed
        total.entries += out.entries
        total.opened += out.opened
        total.resolved += out.resolved
    dirty_jobs |= {j for j, _ in dirty_segments}
    envelopes = [usage_envelope(e, rt.name, (traces or {}).get(e.job_id)) for e in total.entries]
    written = await store.save_jobs(states[j][0] for j in sorted(dirty_jobs))
    await store.save_segments(s for j in sorted(dirty_jobs) for s in states[j][1]
                              if (s.job_id, s.segment_id) in dirty_segments)
    await store.append(total.entries, [str(env.event_id) for env in envelopes])
    await store.anomalies(total.opened, total.resolved, rt.clock())
    await uow.publish_many(envelopes, topic=topic_for(UsageMeteredV1).name)
    await store.roll_up(total.entries)
    if cache is not None:
        for job_id, state in states.items():
            cache.put(job_id, written.get(job_id, versions[job_id]), state)
    for a in total.opened:
        rt.log.warning("metering anomaly: not billed", job_id=a.job_id, segment_id=a.segment_id, code=a.anomaly.code,
                       reason=a.anomaly.message)
    return total


def usage_segment_id(e: Entry) -> str | None:
    """usage.metered names a segment's first charge by the segment id; later revisions
    and reversals get a suffix, so (job_id, segment_id) stays unique on the topic."""
    if e.scope == UsageScope.JOB:
        return None
    if e.entry == EntryKind.REVERSAL:
        return f"{e.segment_id}#r{e.revision}-reversal"
    return e.segment_id if e.revision == 0 else f"{e.segment_id}#r{e.revision}"


def usage_payload(e: Entry) -> dict[str, object]:
    """The usage.metered payload of an entry, as UsageMeteredV1.model_dump(mode="json") writes it
    (a unit test holds the two equal and validates it strictly against the contract)."""
    c = e.charge
    return {"job_id": e.job_id, "scope": e.scope, "segment_id": usage_segment_id(e), "gpu_type": e.gpu_type,
            "gpu_count": e.gpu_count, "gpu_seconds": float(c.gpu_seconds),
            "billable_gpu_seconds": float(c.billable_gpu_seconds), "charge_class": c.charge_class,
            "price_version": c.price_version, "cost": float(c.cost), "currency": "USD", "segments": e.segments}


def _max_length(field: str) -> int:
    """The contract's bound on an Envelope field's length."""
    return min(m.max_length for m in Envelope.model_fields[field].metadata if isinstance(m, MaxLen))


# the Envelope fields' bounds that a usage.metered envelope's values could break (the rest are made here)
_KEY_MAX, _TENANT_MAX = _max_length("key"), _max_length("tenant_id")


def usage_envelope(e: Entry, producer: str, trace_id: str | None) -> Envelope:
    """make_envelope(UsageMeteredV1(...)) without pydantic validation: a settle emits hundreds of these
    per batch, and validating the event and then the envelope was most of their cost. Every value is
    made here or was validated on the way in, except the lengths the envelope bounds, checked here
    (a unit test holds the result equal to the validated path's and valid under the strict contract).
    Without a trace id, the one of the message being handled, else a new one (as `envelope_of`)."""
    if len(e.job_id) > _KEY_MAX or len(e.tenant_id) > _TENANT_MAX:
        raise ValueError(f"usage.metered key: job_id or tenant_id longer than the envelope allows"
                         f" ({_KEY_MAX}/{_TENANT_MAX} characters): {e.job_id[:80]!r}")
    parent = current_envelope.get()
    return Envelope.model_construct(
        event_id=uuid.uuid4(), event_type=UsageMeteredV1.EVENT_TYPE, schema_version=UsageMeteredV1.SCHEMA_VERSION,
        occurred_at=utcnow(), producer=producer, tenant_id=e.tenant_id,
        trace_id=trace_id or (parent.trace_id if parent else None) or new_trace_id(), key=e.job_id,
        payload=usage_payload(e), producer_token=None)
