"""The job's ledger as a function of the events seen so far. Pure.

Every lifecycle event only ADDS a fact to a segment or to its job (a start, a stop,
an admission, a terminal outcome, a review decision); when facts disagree, a total
order picks one, so the facts of a segment do not depend on the order they arrived
in. `settle` then compares what each segment should cost now with what the ledger
already says and writes the difference as new entries: the first charge of a
segment, or a reversal of its previous charge followed by the corrected charge.
Nothing is ever edited, and replaying the same events in any order ends with the
same net amounts.

Refund policy, per job (the seed's "refund full job cost"): a job that fails through
the platform's fault is refunded in full, including the checkpointed spot work of
its earlier preempted segments; an ambiguous failure holds the whole job for
review; a user failure, a cancellation or a success leaves each segment's own class.

A job's total is written once, when it is over: its terminal outcome is known and
every segment seen is settled (billed or anomalous), and either the terminal segment
is the last of an unbroken run of attempts 1..n, or `close_grace` has passed since
the outcome was emitted (a segment-less outcome, such as a cancellation, cannot say
how many segments came before it). Grace periods are event time (domain/clock.py). A segment that turns up after that is billed as
usual; the job's net is always the sum of its segments' entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from whetstone.contracts.enums import ChargeClass, ErrorClass, UsageScope

from .billing import Anomaly, Charge, Pricing, Start, Stop, bill_segment, billing_month, pick_start, pick_stop
from .kinds import EntryKind, Outcome, ReviewDecision, TerminalKind
from .prices import PRICE_BOOK, PriceBook


@dataclass(frozen=True)
class Queued:
    event_id: str
    queued_at: datetime
    tier: str
    price_version: str | None = None   # pinned by the admission quote, if any


@dataclass(frozen=True)
class Terminal:
    event_id: str
    kind: TerminalKind
    at: datetime
    segment_id: str | None = None
    error_class: ErrorClass | None = None
    code: str | None = None
    reported_at: datetime | None = None  # when the event was emitted (grace periods count from it)
    attempts: int | None = None          # a cancel: the attempts the job was ever assigned (0: never placed)
    unstarted_attempt: int | None = None  # a node's cancel report of an attempt that never started
    closed_as: Outcome | None = None      # the outcome the job's total was written with (None: not yet)

    @property
    def reported(self) -> datetime:
        return self.reported_at or self.at

    @property
    def outcome(self) -> Outcome:
        if self.kind == TerminalKind.CANCELLED or self.code == "cancelled":
            return Outcome.CANCELLED
        return Outcome.SUCCEEDED if self.kind == TerminalKind.COMPLETED else Outcome.FAILED


_TERMINAL_ORDER = {TerminalKind.COMPLETED: 0, TerminalKind.FAILED: 1, TerminalKind.CANCELLED: 2}


def _larger(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def pick_queued(current: Queued | None, new: Queued) -> Queued:
    """The first admission counts (a requeue after preemption keeps the quote)."""
    return new if current is None else min(current, new, key=lambda q: (q.queued_at, q.event_id))


def pick_terminal(current: Terminal | None, new: Terminal) -> Terminal:
    """A cancel beats every other outcome: the scheduler accepts one only before the job succeeded, and
    whatever its nodes report afterwards (a completion racing the cancel) does not change the outcome.
    Otherwise a terminal that names its segment beats one that does not (the agent knows what ran).
    What the two say about attempts is kept whichever wins (the same result in any order)."""
    if current is None:
        return new
    won = min(current, new, key=lambda t: (t.outcome != Outcome.CANCELLED, t.segment_id is None,
                                           _TERMINAL_ORDER.get(t.kind, 9), t.at, t.event_id))
    return replace(won, attempts=_larger(current.attempts, new.attempts),
                   unstarted_attempt=_larger(current.unstarted_attempt, new.unstarted_attempt),
                   closed_as=current.closed_as or new.closed_as)


def job_class(terminal: Terminal | None) -> ChargeClass | None:
    if terminal is None or terminal.kind != TerminalKind.FAILED or terminal.outcome == Outcome.CANCELLED:
        return None
    if terminal.error_class == ErrorClass.USER:
        return None
    return ChargeClass.REFUNDED if terminal.error_class == ErrorClass.PLATFORM else ChargeClass.REVIEW


@dataclass
class SegmentState:
    segment_id: str
    job_id: str
    tenant_id: str
    first_seen_at: datetime
    start: Start | None = None
    stop: Stop | None = None
    events: list[str] = field(default_factory=list)
    billed: Charge | None = None      # the charge the ledger currently holds for it
    revision: int = -1                # the last charge revision written
    anomaly: Anomaly | None = None    # the open anomaly, if any

    @property
    def settled(self) -> bool:
        return self.billed is not None or self.anomaly is not None

    def add_event(self, event_id: str) -> None:
        if event_id not in self.events:
            self.events.append(event_id)

    def see_start(self, start: Start) -> None:
        self.start = pick_start(self.start, start)
        self.add_event(start.event_id)

    def see_stop(self, stop: Stop) -> None:
        self.stop = pick_stop(self.stop, stop)
        self.add_event(stop.event_id)


@dataclass
class JobState:
    job_id: str
    tenant_id: str
    first_seen_at: datetime
    queued: Queued | None = None
    terminal: Terminal | None = None
    review_decision: ReviewDecision | None = None
    closed_at: datetime | None = None
    events: list[str] = field(default_factory=list)

    def add_event(self, event_id: str) -> None:
        if event_id not in self.events:
            self.events.append(event_id)

    def see_queued(self, queued: Queued) -> None:
        self.queued = pick_queued(self.queued, queued)
        self.add_event(queued.event_id)

    def see_terminal(self, terminal: Terminal) -> None:
        self.terminal = pick_terminal(self.terminal, terminal)
        self.add_event(terminal.event_id)


@dataclass(frozen=True)
class Entry:
    """One append-only ledger row. Reversals carry negated amounts."""

    job_id: str
    tenant_id: str
    scope: UsageScope
    segment_id: str            # '' for the job total
    entry: EntryKind
    revision: int
    charge: Charge
    gpu_type: str | None
    gpu_count: int
    spot: bool | None
    source_events: tuple[str, ...]
    segments: int = 1
    outcome: Outcome | None = None


@dataclass(frozen=True)
class OpenedAnomaly:
    job_id: str
    tenant_id: str
    segment_id: str
    anomaly: Anomaly
    source_events: tuple[str, ...]


@dataclass(frozen=True)
class Policy:
    tiers: Mapping[str, str]           # tenant -> tier, for jobs whose admission was not seen
    orphan_grace: timedelta = timedelta(minutes=10)  # a stop whose start never came: unknown job
    close_grace: timedelta = timedelta(minutes=2)    # see the module docstring
    book: PriceBook = PRICE_BOOK


@dataclass
class Settlement:
    entries: list[Entry] = field(default_factory=list)
    opened: list[OpenedAnomaly] = field(default_factory=list)
    resolved: list[tuple[str, str, str]] = field(default_factory=list)  # (job_id, segment_id, code)


def pricing_tier(job: JobState, policy: Policy) -> str | None:
    return job.queued.tier if job.queued else policy.tiers.get(job.tenant_id)


def pricing_for(job: JobState, seg: SegmentState, policy: Policy) -> Pricing:
    tier = job.queued.tier if job.queued else policy.tiers.get(seg.tenant_id)
    return Pricing(tier=tier, pinned_version=job.queued.price_version if job.queued else None,
                   job_class=job_class(job.terminal), review_decision=job.review_decision)


def wanted(job: JobState, seg: SegmentState, segments: list[SegmentState], now: datetime,
           policy: Policy) -> Charge | Anomaly | None:
    """What the segment should stand at in the ledger now; None: wait for the other end.
    `now` is event time (domain/clock.py)."""
    if seg.start and seg.stop:
        return bill_segment(seg.start, seg.stop, pricing_for(job, seg, policy), policy.book)
    if seg.stop and now - seg.stop.reported >= policy.orphan_grace:
        if any(s.start for s in segments):
            return Anomaly("stop_without_start", f"the segment's start never arrived ({policy.orphan_grace} waited)")
        return Anomaly("unknown_job", f"no start of any segment of this job arrived ({policy.orphan_grace} waited)")
    if seg.start and job.terminal and now - job.terminal.reported >= policy.close_grace:
        return Anomaly("never_stopped", f"the job ended ({job.terminal.outcome}) but this segment never stopped")
    return None


def settle(job: JobState, segments: list[SegmentState], now: datetime, policy: Policy,
           touched: set[str] | None = None) -> Settlement:
    """Bring the ledger of one job in line with its facts (mutates the states).

    `touched`: the segments that got new facts, when the job itself did not (a settled
    segment whose facts and job are unchanged cannot change); None re-evaluates all."""
    out = Settlement()
    for seg in segments:
        if touched is None or seg.segment_id in touched or not seg.settled:
            _settle_segment(job, seg, wanted(job, seg, segments, now, policy), out)
    if closable(job, segments, now, policy):
        out.entries.append(job_total(job, segments, policy))
        job.closed_at = now
        assert job.terminal is not None
        job.terminal = replace(job.terminal, closed_as=job.terminal.outcome)
    elif (t := job.terminal) is not None and job.closed_at is not None and t.closed_as and t.outcome != t.closed_as:
        # a cancel accepted after training completed (in evaluating): the total written with the
        # completion is reversed and written again as cancelled (same amounts, the true outcome)
        old = job_total(replace(job, terminal=replace(t, kind=TerminalKind.COMPLETED, code=None)), segments, policy)
        out.entries.append(replace(old, entry=EntryKind.REVERSAL, charge=_negate(old.charge), outcome=t.closed_as))
        out.entries.append(replace(job_total(job, segments, policy), revision=1))
        job.terminal = replace(t, closed_as=t.outcome)
    return out


def _settle_segment(job: JobState, seg: SegmentState, want: Charge | Anomaly | None, out: Settlement) -> None:
    if want is None:
        return
    if isinstance(want, Charge):
        if seg.billed != want:
            if seg.billed is not None:
                out.entries.append(_segment_entry(job, seg, seg.billed, EntryKind.REVERSAL))
            seg.revision += 1
            seg.billed = want
            out.entries.append(_segment_entry(job, seg, want, EntryKind.CHARGE))
        if seg.anomaly is not None:
            out.resolved.append((seg.job_id, seg.segment_id, seg.anomaly.code))
            seg.anomaly = None
        return
    if seg.billed is not None:
        out.entries.append(_segment_entry(job, seg, seg.billed, EntryKind.REVERSAL))
        seg.billed = None
    if seg.anomaly is None or seg.anomaly.code != want.code:
        if seg.anomaly is not None:
            out.resolved.append((seg.job_id, seg.segment_id, seg.anomaly.code))
        seg.anomaly = want
        out.opened.append(OpenedAnomaly(seg.job_id, seg.tenant_id, seg.segment_id, want, tuple(seg.events)))


def _negate(c: Charge) -> Charge:
    return replace(c, gpu_seconds=-c.gpu_seconds, billable_gpu_seconds=-c.billable_gpu_seconds, cost=-c.cost,
                   list_cost=-c.list_cost, basis=f"reversal of: {c.basis}")


def _segment_entry(job: JobState, seg: SegmentState, charge: Charge, entry: EntryKind) -> Entry:
    assert seg.start is not None
    return Entry(seg.job_id, seg.tenant_id, UsageScope.SEGMENT, seg.segment_id, entry, seg.revision,
                 _negate(charge) if entry == EntryKind.REVERSAL else charge, seg.start.gpu_type, seg.start.gpu_count,
                 seg.start.spot, tuple(seg.events))


def closable(job: JobState, segments: list[SegmentState], now: datetime, policy: Policy) -> bool:
    t = job.terminal
    if t is None or job.closed_at is not None or not all(s.settled for s in segments):
        return False
    if t.segment_id is not None:
        last = next((s.start for s in segments if s.segment_id == t.segment_id and s.start), None)
        attempts = sorted(s.start.attempt for s in segments if s.start)
        if last and attempts == list(range(1, len(attempts) + 1)) and last.attempt == attempts[-1]:
            return True
    if t.outcome == Outcome.CANCELLED and t.attempts is not None and cancel_accounted(t, segments):
        return True
    return now - t.reported >= policy.close_grace


def cancel_accounted(t: Terminal, segments: list[SegmentState]) -> bool:
    """A cancelled job's total need not wait for the grace once every attempt the scheduler assigned
    (`attempts`, from job.cancelled) is accounted for: a segment that started (and, as closable
    requires, is settled) or the node's report that the attempt never started. A job cancelled
    before it was ever placed (0 attempts) closes at once."""
    seen = {s.start.attempt for s in segments if s.start}
    if t.unstarted_attempt is not None:
        seen.add(t.unstarted_attempt)
    return seen >= set(range(1, (t.attempts or 0) + 1))


def job_total(job: JobState, segments: list[SegmentState], policy: Policy) -> Entry:
    assert job.terminal is not None
    billed = [s for s in segments if s.billed is not None]
    charges = [s.billed for s in billed if s.billed is not None]
    classes = {c.charge_class for c in charges}
    if ChargeClass.REVIEW in classes:
        klass = ChargeClass.REVIEW
    elif classes == {ChargeClass.REFUNDED} or (not charges and job_class(job.terminal) == ChargeClass.REFUNDED):
        klass = ChargeClass.REFUNDED
    else:
        klass = ChargeClass.CHARGED
    versions = sorted({c.price_version for c in charges})
    if not versions:
        in_effect = policy.book.in_effect(job.terminal.at)
        versions = [in_effect.version if in_effect else "none"]
    gpu_types = {s.start.gpu_type for s in billed if s.start}
    total = Charge(
        klass, sum((c.gpu_seconds for c in charges), Decimal(0)),
        sum((c.billable_gpu_seconds for c in charges), Decimal(0)), Decimal(0),
        sum((c.cost for c in charges), Decimal(0)), sum((c.list_cost for c in charges), Decimal(0)),
        "+".join(versions), "+".join(sorted({c.tier for c in charges})) or (pricing_tier(job, policy) or "none"),
        billing_month(job.terminal.at),
        f"job {job.terminal.outcome}: {len(charges)} segment(s)")
    events = [e for s in segments for e in s.events] + [e for e in job.events if e]
    return Entry(job.job_id, job.tenant_id, UsageScope.JOB, "", EntryKind.CHARGE, 0, total,
                 gpu_types.pop() if len(gpu_types) == 1 else ("mixed" if gpu_types else None),
                 max((s.start.gpu_count for s in billed if s.start), default=0), None,
                 tuple(dict.fromkeys(events)), len(charges),
                 job.terminal.outcome)
