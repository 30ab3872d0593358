"""The ledger as a function of the facts: waiting for the other end, corrections as
reversals, job totals, grace periods, and order independence against the simulator's
ground truth."""

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from whetstone.contracts import TOPICS
from whetstone.metering.domain.usage import job_class_of
from whetstone.metering.domain.billing import Start, Stop
from whetstone.metering.domain.ledger import Entry, JobState, Policy, Queued, SegmentState, Terminal, settle
from whetstone.metering.usecases.metering import fact_of
from whetstone.devstack.metering_sim import Invoice, generate
from whetstone.runtime.messaging import decode, parse_payload

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)
NOW = datetime(2026, 11, 20, tzinfo=UTC)
POLICY = Policy(tiers={"demo": "standard"}, orphan_grace=timedelta(minutes=10), close_grace=timedelta(minutes=2))


def start(seg: str, attempt: int, hours: float, spot: bool = True) -> Start:
    return Start(f"{seg}-start", T0 + timedelta(hours=hours), "A100", 1, spot, attempt, "n1")


def stop(seg: str, kind: str, hours: float, **kw) -> Stop:
    return Stop(f"{seg}-{kind}", kind, T0 + timedelta(hours=hours), **kw)


def job_and(*segment_ids: str) -> tuple[JobState, list[SegmentState]]:
    return JobState("j", "demo", NOW), [SegmentState(s, "j", "demo", NOW) for s in segment_ids]


def net(entries: list[Entry]) -> Decimal:
    return sum((e.charge.cost for e in entries if e.scope == "segment"), Decimal(0))


def at(hours: float, minutes: float = 0) -> datetime:
    """An event time: grace periods count in event time (domain/clock.py)."""
    return T0 + timedelta(hours=hours, minutes=minutes)


def test_a_stop_that_arrives_first_waits_for_its_start_and_is_billed_once():
    job, (s1,) = job_and("s1")
    s1.see_stop(stop("s1", "preempted", 1, checkpointed_at=T0 + timedelta(minutes=30)))
    assert settle(job, [s1], at(1, 1), POLICY).entries == []
    s1.see_start(start("s1", 1, 0))
    out = settle(job, [s1], at(1, 2), POLICY)
    assert [(e.entry, e.revision, e.charge.cost) for e in out.entries] == [("charge", 0, Decimal("0.600000"))]
    assert settle(job, [s1], at(1, 3), POLICY).entries == []  # settling again changes nothing


def test_a_platform_failure_reverses_the_earlier_charges_and_refunds_them():
    job, (s1, s2) = job_and("s1", "s2")
    s1.see_start(start("s1", 1, 0))
    s1.see_stop(stop("s1", "preempted", 1, checkpointed_at=T0 + timedelta(hours=1)))
    first = settle(job, [s1, s2], at(1), POLICY).entries
    s2.see_start(start("s2", 2, 2))
    failure = stop("s2", "failed", 3, error_class="platform", code="oom_misallocation")
    s2.see_stop(failure)
    job.see_terminal(Terminal(failure.event_id, "failed", failure.stopped_at, "s2", "platform", "oom"))
    later = settle(job, [s1, s2], at(3), POLICY).entries
    assert [(e.segment_id, e.entry, e.revision, e.charge.charge_class) for e in first + later] == [
        ("s1", "charge", 0, "charged"), ("s1", "reversal", 0, "charged"), ("s1", "charge", 1, "refunded"),
        ("s2", "charge", 0, "refunded"), ("", "charge", 0, "refunded")]
    assert net(first + later) == 0
    total = later[-1]
    assert total.scope == "job" and total.charge.list_cost == Decimal("2.400000")  # what was refunded


def test_the_total_waits_for_a_missing_attempt_until_the_grace_period():
    job, (s2,) = job_and("s2")
    s2.see_start(start("s2", 2, 2))
    s2.see_stop(stop("s2", "completed", 3))
    job.see_terminal(Terminal("s2-completed", "completed", at(3), "s2"))
    assert [e.scope for e in settle(job, [s2], at(3), POLICY).entries] == ["segment"]  # attempt 1 unseen
    assert job.closed_at is None
    late = settle(job, [s2], at(3) + POLICY.close_grace, POLICY).entries
    assert [e.scope for e in late] == ["job"] and job.closed_at == at(3) + POLICY.close_grace


def test_a_segment_less_outcome_closes_the_job_after_the_grace_period():
    job, (s1,) = job_and("s1")
    s1.see_start(start("s1", 1, 0))
    s1.see_stop(stop("s1", "preempted", 1, checkpointed_at=T0 + timedelta(minutes=30)))
    job.see_terminal(Terminal("cancel", "cancelled", at(2)))
    assert [e.scope for e in settle(job, [s1], at(2), POLICY).entries] == ["segment"]
    total = settle(job, [s1], at(2, 3), POLICY).entries
    assert [(e.scope, e.outcome, e.charge.cost) for e in total] == [("job", "cancelled", Decimal("0.600000"))]


def test_a_stop_without_a_start_becomes_an_unknown_job_then_is_explained_by_a_late_start():
    job, (s1,) = job_and("s1")
    s1.see_stop(stop("s1", "completed", 1))
    assert settle(job, [s1], at(1, 5), POLICY).opened == []
    out = settle(job, [s1], at(1, 11), POLICY)
    assert [a.anomaly.code for a in out.opened] == ["unknown_job"] and out.entries == []
    s1.see_start(start("s1", 1, 0, spot=False))
    out = settle(job, [s1], at(1, 12), POLICY)
    assert out.resolved == [("j", "s1", "unknown_job")] and net(out.entries) == Decimal("3.000000")


def test_grace_periods_count_from_when_the_event_was_emitted():
    job, (s1,) = job_and("s1")
    s1.see_stop(Stop("e", "completed", at(1), reported_at=at(5)))  # reported four hours after the fact
    assert settle(job, [s1], at(5, 5), POLICY).opened == []
    assert [a.anomaly.code for a in settle(job, [s1], at(5, 11), POLICY).opened] == ["unknown_job"]


def test_a_segment_that_never_stops_after_its_job_ended_is_an_anomaly():
    job, (s1, s2) = job_and("s1", "s2")
    s1.see_start(start("s1", 1, 0))
    s2.see_start(start("s2", 2, 1))
    s2.see_stop(stop("s2", "completed", 2))
    job.see_terminal(Terminal("s2-completed", "completed", at(2), "s2"))
    settle(job, [s1, s2], at(2), POLICY)
    out = settle(job, [s1, s2], at(2, 3), POLICY)
    assert [a.anomaly.code for a in out.opened] == ["never_stopped"] and job.closed_at is not None


def test_a_quote_that_arrives_late_reprices_with_a_correction_and_queue_time_is_never_billed():
    job, (s1,) = job_and("s1")
    s1.see_start(start("s1", 1, 0, spot=False))
    s1.see_stop(stop("s1", "completed", 1))
    first = settle(job, [s1], NOW, POLICY).entries
    job.see_queued(Queued("q", T0 - timedelta(hours=6), "standard", "2026-01"))  # queued 6 hours earlier
    later = settle(job, [s1], NOW, POLICY).entries
    assert [(e.entry, e.charge.price_version, e.charge.cost) for e in first + later] == [
        ("charge", "2026-11", Decimal("3.000000")), ("reversal", "2026-11", Decimal("-3.000000")),
        ("charge", "2026-01", Decimal("3.400000"))]
    assert later[-1].charge.gpu_seconds == 3600  # from the start, not from the admission


# -- order independence against the generator's ground truth ---------------------------------------


def pure_replay(messages: list[tuple[str, bytes, bytes]]) -> dict[str, Invoice]:
    """The domain alone (no database): facts in delivery order, settled as they come, then once
    more after every grace period. Invoice = the sum of each job's entries."""
    jobs: dict[str, JobState] = {}
    segments: dict[str, dict[str, SegmentState]] = defaultdict(dict)
    entries: dict[str, list[Entry]] = defaultdict(list)
    seen: set[str] = set()
    policy = Policy(tiers={"demo": "standard", "acme": "premium", "hobbyist": "free"})
    for topic, _, raw in messages:
        env = decode(raw)
        if str(env.event_id) in seen:
            continue
        seen.add(str(env.event_id))
        f = fact_of(env, parse_payload(env, TOPICS[topic].model), raw, NOW)
        job = jobs.setdefault(f.job_id, JobState(f.job_id, f.tenant_id, NOW))
        if f.segment_id:
            seg = segments[f.job_id].setdefault(f.segment_id, SegmentState(f.segment_id, f.job_id, f.tenant_id, NOW))
            if f.start:
                seg.see_start(f.start)
            if f.stop:
                seg.see_stop(f.stop)
        if f.queued:
            job.see_queued(f.queued)
        if f.terminal:
            job.see_terminal(f.terminal)
        entries[f.job_id] += settle(job, sorted(segments[f.job_id].values(), key=lambda s: s.segment_id), NOW,
                                    policy).entries
    for job_id, job in jobs.items():
        segs = sorted(segments[job_id].values(), key=lambda s: s.segment_id)
        entries[job_id] += settle(job, segs, datetime(2028, 1, 1, tzinfo=UTC), policy).entries
    out = {}
    for job_id, rows in entries.items():
        seg_rows = [e for e in rows if e.scope == "segment"]
        total = next(e for e in rows if e.scope == "job")
        current = {}
        for e in seg_rows:
            current[e.segment_id] = e if e.entry == "charge" else None
        out[job_id] = Invoice(sum((e.charge.gpu_seconds for e in seg_rows), Decimal(0)),
                              sum((e.charge.billable_gpu_seconds for e in seg_rows), Decimal(0)),
                              sum((e.charge.cost for e in seg_rows), Decimal(0)),
                              job_class_of({e.charge.charge_class for e in current.values() if e},
                                           total.charge.charge_class))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_delivery_order_gives_the_ground_truth(seed):
    work = generate(3000, seed=seed)
    shuffled = list(work.messages)
    random.Random(seed).shuffle(shuffled)  # far worse than Kafka: no order even within a job's topic
    for messages in (work.messages, shuffled):
        invoices = pure_replay(messages)
        wrong = {j: (invoices.get(j), truth) for j, truth in work.invoices.items() if invoices.get(j) != truth}
        assert not wrong, list(wrong.items())[:3]


def test_a_cancel_wins_over_a_racing_completion_and_closes_once_its_attempts_are_accounted():
    """A completion the node sent before it heard the cancel does not book the job as a
    success; the total waits only for the attempts the scheduler assigned, not for the grace."""
    job, (s1,) = job_and("s1")
    s1.see_start(start("s1", 1, 0))
    s1.see_stop(stop("s1", "completed", 1))
    job.see_terminal(Terminal("cancel", "cancelled", at(0, 50), attempts=1))
    job.see_terminal(Terminal("done", "completed", at(1), "s1"))
    out = settle(job, [s1], at(1, 0.1), POLICY)
    (total,) = [e for e in out.entries if e.scope == "job"]
    assert total.outcome == "cancelled" and total.charge.gpu_seconds == Decimal(3600)


def test_a_job_cancelled_before_it_was_placed_closes_at_once_with_nothing_billed():
    job, _ = job_and()
    job.see_terminal(Terminal("cancel", "cancelled", at(0), attempts=0))
    (total,) = settle(job, [], at(0, 0.01), POLICY).entries
    assert total.outcome == "cancelled" and total.charge.gpu_seconds == 0 and job.closed_at is not None


def test_a_cancelled_attempt_that_never_started_is_accounted_by_the_nodes_report():
    job, (s1,) = job_and("s1")
    s1.see_start(start("s1", 1, 0))
    s1.see_stop(stop("s1", "preempted", 1, checkpointed_at=T0 + timedelta(hours=1)))
    job.see_terminal(Terminal("cancel", "cancelled", at(2), attempts=2))
    assert not [e for e in settle(job, [s1], at(2, 0.1), POLICY).entries if e.scope == "job"]   # attempt 2?
    job.see_terminal(Terminal("node", "failed", at(2), None, "user", "cancelled", unstarted_attempt=2))
    (total,) = [e for e in settle(job, [s1], at(2, 0.2), POLICY).entries if e.scope == "job"]
    assert total.outcome == "cancelled" and total.charge.gpu_seconds == Decimal(3600)


def test_a_nodes_cancel_report_without_a_segment_names_the_attempt_that_never_started():
    from whetstone.contracts import Envelope, JobFailedV1
    ev = JobFailedV1(job_id="j", error_class="user", code="cancelled", message="x", node_id="n1", attempt=3)
    env = Envelope(event_type=ev.EVENT_TYPE, producer="trainer-agent", tenant_id="demo", key="j",
                   payload=ev.model_dump(mode="json"))
    fact = fact_of(env, ev, b"{}", T0)
    assert fact.stop is None and fact.terminal.unstarted_attempt == 3 and fact.terminal.outcome == "cancelled"


def test_a_cancel_in_evaluating_corrects_the_total_closed_at_the_completion():
    """Training completed (the total closed as succeeded), then the cancel was accepted while the gate
    ran: the total is reversed and written again as cancelled, with the same GPU-seconds."""
    job, (s1,) = job_and("s1")
    s1.see_start(start("s1", 1, 0))
    s1.see_stop(stop("s1", "completed", 1))
    job.see_terminal(Terminal("done", "completed", at(1), "s1"))
    (seg, total) = settle(job, [s1], at(1, 0.1), POLICY).entries
    assert total.outcome == "succeeded" and job.terminal.closed_as == "succeeded"
    job.see_terminal(Terminal("cancel", "cancelled", at(1, 1), attempts=1))
    reversal, again = settle(job, [s1], at(1, 1.1), POLICY).entries
    assert (reversal.entry, reversal.outcome, reversal.charge.gpu_seconds) == ("reversal", "succeeded", -Decimal(3600))
    assert (again.entry, again.revision, again.outcome, again.charge.gpu_seconds) == ("charge", 1, "cancelled",
                                                                                     Decimal(3600))
    assert settle(job, [s1], at(1, 2), POLICY).entries == []   # once
