"""A reproducible synthetic workload of job lifecycles, with the invoices it must produce.

Used by the benchmark (bench/metering.py), the chaos test (tests/chaos/test_metering_chaos.py) and
metering's domain tests. The ground truth is a plain restatement of the billing rules, computed
from what the generator decided (not from the events, and not with the service's code): a segment runs from start to
stop on `gpus` GPUs; completed and user-failed segments are charged in full at the
node's capacity price, preempted ones at the spot price up to their checkpoint,
platform failures refund the whole job, ambiguous ones hold it for review.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from whetstone.contracts import (
    CheckpointRef, Event, JobCancelledV1, JobCompletedV1, JobFailedV1, JobPreemptedV1, JobQueuedV1, JobStartedV1,
    Resources, TrainingSpec, topic_for,
)
from whetstone.metering.domain.prices import PRICE_BOOK
from whetstone.runtime.messaging import encode, make_envelope

TENANTS = {"demo": "standard", "acme": "premium", "hobbyist": "free"}
GPUS = ["A100", "H100", "L4", "cpu"]
YEAR_START = datetime(2026, 1, 10, tzinfo=UTC)
_SPEC = TrainingSpec(base_model="m", base_model_sha256="ab" * 32, dataset_id="ds", dataset_version="cd" * 32,
                     train_uri="s3://whetstone/datasets/ds/train.jsonl", method="lora", hyperparameters={},
                     hyperparameters_hash="ef" * 32)
_CK = CheckpointRef(uri="s3://whetstone/ck", step=10, manifest_sha256="0" * 64)


@dataclass(frozen=True)
class Invoice:
    """A job's net: what the ledger must hold for it, whatever the delivery order."""

    gpu_seconds: Decimal
    billable_gpu_seconds: Decimal
    cost: Decimal
    charge_class: str


@dataclass
class Segment:
    segment_id: str
    attempt: int
    start: datetime
    stop: datetime
    kind: str                          # completed | failed | preempted
    error_class: str | None = None
    checkpointed_at: datetime | None = None


@dataclass
class Job:
    job_id: str
    tenant_id: str
    gpu_type: str
    gpus: int
    spot: bool
    submitted_at: datetime
    admitted: bool = True               # False: rejected at admission, never queued
    segments: list[Segment] = field(default_factory=list)
    outcome: str = "completed"          # completed | failed | cancelled
    error_class: str | None = None      # of the job's failure
    segment_less_end: bool = False      # the scheduler ended it (job.failed without a segment)
    anomaly: str | None = None          # the anomaly code its bad input must produce


@dataclass
class Workload:
    messages: list[tuple[str, bytes, bytes]]   # (topic, key, value) in delivery order, duplicates included
    unique_events: int
    jobs: list[Job]
    invoices: dict[str, Invoice]
    anomalies: dict[str, str]                  # job_id -> anomaly code expected


# -- ground truth -----------------------------------------------------------------------------


def _round(usd: Decimal) -> Decimal:
    return usd.quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP)


def _seconds(start: datetime, stop: datetime) -> Decimal:
    return Decimal(round((stop - start).total_seconds() * 1_000_000)) / 1_000_000


def expected_invoice(job: Job) -> Invoice:
    if job.anomaly is not None:
        return Invoice(Decimal(0), Decimal(0), Decimal(0), "charged")
    tier = TENANTS[job.tenant_id]
    job_level = None
    if job.outcome == "failed":
        job_level = {"platform": "refunded", "ambiguous": "review"}.get(job.error_class or "")
    gpu_s = billable = cost = Decimal(0)
    classes = []
    for s in job.segments:
        version = "2026-11" if s.start >= datetime(2026, 11, 1, tzinfo=UTC) else "2026-01"
        rate = PRICE_BOOK.get(version).rate(job.gpu_type, tier)  # type: ignore[union-attr]
        seconds = _seconds(s.start, s.stop)
        if s.kind == "preempted":
            done = _seconds(s.start, s.checkpointed_at) if s.checkpointed_at else Decimal(0)
            work, price, klass = min(max(done, Decimal(0)), seconds) * job.gpus, rate.spot, "charged"
        else:
            work, price = seconds * job.gpus, rate.spot if job.spot else rate.on_demand
            klass = {"platform": "refunded", "ambiguous": "review"}.get(s.error_class or "", "charged")
        if job_level == "refunded" or (job_level == "review" and klass == "charged"):
            klass = job_level
        gpu_s += seconds * job.gpus
        classes.append(klass)
        if klass == "charged":
            billable += work
            cost += _round(work * price / 3600)
    if "review" in classes:
        job_class = "review"
    elif classes and set(classes) == {"refunded"}:
        job_class = "refunded"
    elif not classes and job_level == "refunded":
        job_class = "refunded"
    else:
        job_class = "charged"
    return Invoice(gpu_s, billable, cost, job_class)


# -- generation -------------------------------------------------------------------------------


def _job(rng: random.Random, n: int) -> Job:
    tenant = rng.choices(list(TENANTS), weights=[5, 3, 2])[0]
    submitted_at = YEAR_START + timedelta(seconds=rng.uniform(0, 335 * 86400))
    job = Job(f"ftjob-sim-{n:07d}", tenant, rng.choice(GPUS), rng.choice([1, 1, 2, 4, 8]), rng.random() < 0.4,
              submitted_at)
    if rng.random() < 0.015:  # rejected at admission: a failure, never queued, never ran
        job.admitted, job.outcome, job.error_class, job.segment_less_end = False, "failed", "user", True
        return job
    t = submitted_at + timedelta(seconds=rng.uniform(0, 7200))  # queue time: never billed
    attempt = 1
    while True:
        stop = t + timedelta(seconds=rng.uniform(300, 12 * 3600))
        seg = Segment(f"{job.job_id}-s{attempt}", attempt, t, stop, "completed")
        job.segments.append(seg)
        if attempt < 8 and rng.random() < 0.7:
            seg.kind = "preempted"
            if rng.random() < 0.8:
                seg.checkpointed_at = t + (stop - t) * rng.random()
            if rng.random() < 0.03:  # the scheduler gives up on it
                job.outcome, job.error_class, job.segment_less_end = "failed", "platform", True
                return job
            if rng.random() < 0.03:  # the tenant cancels it while it waits to resume
                job.outcome, job.segment_less_end = "cancelled", True
                return job
            t = stop + timedelta(seconds=rng.uniform(60, 3600))
            attempt += 1
            continue
        end = rng.random()
        if end < 0.12:
            seg.kind, seg.error_class = "failed", "user"
        elif end < 0.22:
            seg.kind, seg.error_class = "failed", "platform"
        elif end < 0.30:
            seg.kind, seg.error_class = "failed", "ambiguous"
        if seg.kind == "failed":
            job.outcome, job.error_class = "failed", seg.error_class
        return job


def _bad_input(rng: random.Random, job: Job) -> None:
    """Turn a simple job into bad input that must become an anomaly."""
    job.segments = job.segments[:1]
    seg = job.segments[0]
    seg.kind, seg.error_class, seg.checkpointed_at = "completed", None, None
    job.outcome, job.error_class, job.segment_less_end = "completed", None, False
    job.anomaly = rng.choice(["stop_before_start", "unknown_gpu_type", "absurd_duration"])
    if job.anomaly == "stop_before_start":
        seg.stop = seg.start - timedelta(minutes=10)
    elif job.anomaly == "unknown_gpu_type":
        job.gpu_type = "TPUv9"
    else:
        seg.stop = seg.start + timedelta(days=45)


def _events(job: Job) -> Iterator[tuple[datetime, Event]]:
    if job.admitted:
        yield job.submitted_at, JobQueuedV1(job_id=job.job_id, tier=TENANTS[job.tenant_id], spec=_SPEC,
                                         resources=Resources(gpu_type=job.gpu_type, gpus_per_node=job.gpus))
    for i, s in enumerate(job.segments):
        yield s.start, JobStartedV1(job_id=job.job_id, node_id="n1", segment_id=s.segment_id, attempt=s.attempt,
                                    gpu_type=job.gpu_type, gpu_count=job.gpus, spot=job.spot, started_at=s.start)
        if s.kind == "preempted":
            yield s.stop, JobPreemptedV1(job_id=job.job_id, segment_id=s.segment_id, node_id="n1", reason="spot_loss",
                                         stopped_at=s.stop, checkpoint=_CK if s.checkpointed_at else None,
                                         checkpointed_at=s.checkpointed_at)
            if i + 1 < len(job.segments) or job.outcome == "cancelled":
                yield s.stop, JobQueuedV1(job_id=job.job_id, tier=TENANTS[job.tenant_id], spec=_SPEC, requeued=True,
                                          resources=Resources(gpu_type=job.gpu_type, gpus_per_node=job.gpus))
        elif s.kind == "completed":
            yield s.stop, JobCompletedV1(job_id=job.job_id, segment_id=s.segment_id, node_id="n1", stopped_at=s.stop,
                                         steps=100, final_checkpoint=_CK)
        else:
            yield s.stop, JobFailedV1(job_id=job.job_id, segment_id=s.segment_id, node_id="n1", stopped_at=s.stop,
                                      error_class=s.error_class, code="training_failed", message="failed")
    if job.segment_less_end:
        at = job.segments[-1].stop + timedelta(seconds=60) if job.segments else job.submitted_at
        if job.outcome == "cancelled":
            yield at, JobCancelledV1(job_id=job.job_id)
        else:
            yield at, JobFailedV1(job_id=job.job_id, error_class=job.error_class, code="scheduler_gave_up",
                                  message="failed by the scheduler")


def generate(target_events: int, seed: int = 7, duplicate_rate: float = 0.10, bad_input_rate: float = 0.005,
             reorder_rate: float = 0.05) -> Workload:
    """About `target_events` messages (duplicates included) for as many jobs as that takes."""
    rng = random.Random(seed)
    unique: list[tuple[float, str, bytes, bytes]] = []
    jobs: list[Job] = []
    while len(unique) * (1 + duplicate_rate) < target_events:
        job = _job(rng, len(jobs))
        if len(job.segments) == 1 and not job.segment_less_end and rng.random() < bad_input_rate * 2:
            _bad_input(rng, job)
        jobs.append(job)
        for at, ev in _events(job):
            env = make_envelope(ev, producer="sim", tenant_id=job.tenant_id)
            env = env.model_copy(update={"occurred_at": at})
            sort_key = at.timestamp()
            if isinstance(ev, JobStartedV1) and rng.random() < reorder_rate:
                sort_key += 7200  # the start is sent after its stop: legitimate cross-topic reordering
            unique.append((sort_key, topic_for(ev).name, env.key.encode(), encode(env)))
    unique.sort(key=lambda m: m[0])
    order: list[tuple[float, tuple[str, bytes, bytes]]] = [(float(i), m[1:]) for i, m in enumerate(unique)]
    for i, m in enumerate(unique):
        if rng.random() < duplicate_rate:  # redelivered later, sometimes much later
            order.append((i + rng.expovariate(1 / 2000), m[1:]))
    order.sort(key=lambda x: x[0])
    return Workload([m for _, m in order], len(unique), jobs, {j.job_id: expected_invoice(j) for j in jobs},
                    {j.job_id: j.anomaly for j in jobs if j.anomaly})
