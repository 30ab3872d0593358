"""Quotas per tenant: soft monthly GPU-hours (overage allowed, flagged), hard cap (rejected),
concurrency cap (jobs in flight). Pure; the handler supplies usage, which comes only from
usage.metered events, and serialises one tenant's admissions with a lock."""

from __future__ import annotations

from dataclasses import dataclass

from .job_data import QuotaRecord
from .jobs import Rejection


@dataclass(frozen=True)
class Quota:
    soft_gpu_hours: float | None = None
    hard_gpu_hours: float | None = None
    max_in_flight: int | None = None


DEFAULT_QUOTAS: dict[str, Quota] = {
    "free": Quota(soft_gpu_hours=10, hard_gpu_hours=20, max_in_flight=2),
    "standard": Quota(soft_gpu_hours=500, hard_gpu_hours=2000, max_in_flight=20),
    "premium": Quota(soft_gpu_hours=5000, hard_gpu_hours=None, max_in_flight=100),
}


@dataclass(frozen=True)
class Usage:
    gpu_hours: float        # metered this calendar month
    in_flight: int          # jobs not yet succeeded, failed or cancelled


@dataclass(frozen=True)
class QuotaVerdict:
    over_soft: bool
    used_gpu_hours: float
    estimated_gpu_hours: float
    soft_gpu_hours: float | None
    hard_gpu_hours: float | None

    def record(self) -> QuotaRecord:
        return QuotaRecord(over_soft_quota=self.over_soft, used_gpu_hours=round(self.used_gpu_hours, 3),
                           estimated_gpu_hours=round(self.estimated_gpu_hours, 3),
                           soft_gpu_hours=self.soft_gpu_hours, hard_gpu_hours=self.hard_gpu_hours)


def check_submission(quota: Quota, usage: Usage) -> Rejection | None:
    """At submission: the concurrency cap and an already exhausted hard cap."""
    if quota.max_in_flight is not None and usage.in_flight >= quota.max_in_flight:
        return Rejection("concurrency_quota_exceeded",
                         f"{usage.in_flight} jobs already in flight; the limit is {quota.max_in_flight}: "
                         "wait for one to finish or cancel one")
    if quota.hard_gpu_hours is not None and usage.gpu_hours >= quota.hard_gpu_hours:
        return Rejection("hard_quota_exceeded",
                         f"{usage.gpu_hours:.2f} of the {quota.hard_gpu_hours:g} GPU-hour monthly hard cap "
                         "already used")
    return None


def check_estimate(quota: Quota, usage: Usage, estimated_gpu_hours: float) -> Rejection | QuotaVerdict:
    """Once the job's size is known: over the hard cap is refused, over the soft one is flagged."""
    after = usage.gpu_hours + estimated_gpu_hours
    if quota.hard_gpu_hours is not None and after > quota.hard_gpu_hours:
        return Rejection("hard_quota_exceeded",
                         f"this job needs about {estimated_gpu_hours:.2f} GPU-hours; with {usage.gpu_hours:.2f} "
                         f"used this month that exceeds the hard cap of {quota.hard_gpu_hours:g}")
    over_soft = quota.soft_gpu_hours is not None and after > quota.soft_gpu_hours
    return QuotaVerdict(over_soft, usage.gpu_hours, estimated_gpu_hours, quota.soft_gpu_hours, quota.hard_gpu_hours)


@dataclass(frozen=True)
class JobUsage:
    """What usage.metered has said about one job so far. Segment events (first charges,
    corrections and their reversals, each under its own segment key) sum to the ledger; the
    job total stands in only while no segment event has arrived, so each GPU-second counts
    once whatever the order, and corrections after the job closed still reach the quota."""

    segments: int = 0
    segment_seconds: float = 0.0
    segment_cost: float = 0.0
    total_seconds: float | None = None
    total_cost: float | None = None

    def counted(self) -> tuple[float, float]:
        if self.segments:
            return self.segment_seconds, self.segment_cost
        return self.total_seconds or 0.0, self.total_cost or 0.0

    def with_segment(self, seconds: float, cost: float) -> JobUsage:
        return JobUsage(self.segments + 1, self.segment_seconds + seconds, self.segment_cost + cost,
                        self.total_seconds, self.total_cost)

    def with_total(self, seconds: float, cost: float) -> JobUsage:
        return JobUsage(self.segments, self.segment_seconds, self.segment_cost, seconds, cost)


def usage_delta(before: JobUsage, after: JobUsage) -> tuple[float, float]:
    """GPU-seconds and cost to add to the tenant's month when a job's usage goes from before to after."""
    (s0, c0), (s1, c1) = before.counted(), after.counted()
    return s1 - s0, c1 - c0
