"""Usage API.

Tenants (a verified caller with `read`): a job's ledger (`total` once the job is over, the
current line of each segment, every append-only entry), the events behind any line (audit), a
month's usage. Operators (scope `admin`): open anomalies, jobs held for review, review decisions.
Another tenant's job or line answers 404, never its data.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Query

from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import not_found, operator_only
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.service import Runtime

from ..context import MeteringContext
from ..usecases import usage
from ..usecases.review import review_job
from .responses import (
    Anomalies, AuditEventOut, HeldForReview, JobUsageOut, Line, LineEvents, MonthUsage, ReviewBody, ReviewDone,
    Reviews, TenantAnomaly,
)

MONTH = r"^\d{4}-\d{2}$"


def this_month() -> str:
    return datetime.now(UTC).strftime("%Y-%m")


def routes(rt: Runtime[MeteringContext]) -> APIRouter:
    r = APIRouter(prefix="/v1/usage")

    @r.get("/jobs/{job_id}")
    async def job_usage(job_id: str, caller: Caller = require("read")) -> JobUsageOut:
        found = await usage.job_usage(rt, job_id, caller.tenant_id)
        if found is None:
            raise not_found(f"no metered usage for {job_id} yet", code="no_usage")
        return JobUsageOut.of(found)

    @r.get("/lines/{line_id}/events")
    async def line_events(line_id: int, caller: Caller = require("read")) -> LineEvents:
        """Audit: the events that produced a ledger line."""
        found = await usage.line_audit(rt, line_id, caller.tenant_id)
        if found is None:
            raise not_found(f"no ledger line {line_id}", code="no_such_line")
        line, events = found
        return LineEvents(line=Line.of(line), events=[AuditEventOut.of(e) for e in events])

    @r.get("")
    async def my_usage(caller: Caller = require("read"), month: str | None = Query(None, pattern=MONTH)) -> MonthUsage:
        """The caller's tenant, one month (default: the current one)."""
        return MonthUsage.of(await usage.month_usage(rt, caller.tenant_id, month or this_month()))

    @r.get("/tenants/{tenant_id}")
    async def tenant_usage(tenant_id: str, caller: Caller = require("read"),
                           month: str | None = Query(None, pattern=MONTH)) -> MonthUsage:
        """One tenant's month (default: the current one); a tenant's own admin key, or an operator."""
        if tenant_id != caller.tenant_id and not caller.operator:   # a tenant's admin key sees its own tenant
            raise not_found(f"no usage for tenant {tenant_id}", code="unknown_tenant", param="tenant_id")
        return MonthUsage.of(await usage.month_usage(rt, tenant_id, month or this_month()))

    @r.get("/anomalies")
    async def open_anomalies(caller: Caller = require("admin"), limit: int = Query(100, le=1000)) -> Anomalies:
        operator_only(caller)
        return Anomalies(data=[TenantAnomaly.of(a) for a in await usage.open_anomalies(rt, limit)])

    @r.get("/reviews")
    async def pending_reviews(caller: Caller = require("admin"), limit: int = Query(100, le=1000)) -> Reviews:
        operator_only(caller)
        return Reviews(data=[HeldForReview.of(h) for h in await usage.held_for_review(rt, limit)])

    @r.post("/jobs/{job_id}/review")
    async def review(job_id: str, body: ReviewBody, caller: Caller = require("admin")) -> ReviewDone:
        operator_only(caller)
        result = await review_job(rt, job_id, body.decision, f"{caller.tenant_id}/{caller.key_id}", body.note)
        if result is None:
            raise not_found(f"no metered usage for {job_id}", code="no_usage")
        if not result.entries:
            raise ApiError(409, f"{job_id} holds nothing for review", code="nothing_to_review")
        return ReviewDone(job_id=job_id, decision=body.decision, entries=len(result.entries))

    return r
