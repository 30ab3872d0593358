"""Public job API, shaped like OpenAI's fine-tuning API (the official `openai` client drives it).
The caller's tenant comes from the identity the gateway signed (`require`); a tenant only ever
sees its own jobs (another tenant's job id answers 404). Creating a job records it and wakes the
scheduling loop: no scheduling cycle runs inside the request."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse

from whetstone.contracts import job_id_for
from whetstone.runtime.errors import ApiError
from whetstone.runtime.http import ListObject, ListPage, list_object, list_page, not_found
from whetstone.runtime.identity import Caller, require
from whetstone.runtime.service import Runtime

from . import templates
from ..usecases.admission import IdempotencyConflict, Rejected, submit_job
from ..adapters.event_wakes import EventWakes
from ..adapters.store import JobStore
from ..context import SchedulerContext
from ..domain import jobs as rules
from ..domain.job import Job
from ..domain.forecast import Forecast
from ..usecases.cancel import cancel_job
from ..usecases.pause import PauseConflict, pause_job, resume_job
from .loop import run_cycle
from .requests import CreateJob, to_request
from .job_object import FineTuningJob
from .views import CheckpointObject, EventObject, checkpoint_view, event_view, job_view, parse_event_id

# The caller's trace id (X-Trace-Id) follows the job through every event; a fresh one otherwise.
TRACE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
STREAM_FALLBACK_S = 5.0   # a stream is woken by NOTIFY (EventWakes); it looks on its own this often


def rejected(exc: Rejected) -> ApiError:
    # quota refusals are not fixed by the client's automatic retries: say so
    kind = {403: "permission_error", 429: "rate_limit_error"}.get(exc.status, "invalid_request_error")
    return ApiError(exc.status, exc.message, type=kind, code=exc.code, param=exc.param, retry=False)


def routes(rt: Runtime[SchedulerContext]) -> APIRouter:
    r = APIRouter(prefix="/v1/fine_tuning")
    wakes = EventWakes(rt.settings.database_url, STREAM_FALLBACK_S)   # one LISTEN connection per process

    async def owned(store: JobStore, job_id: str, caller: Caller, lock: bool = False) -> Job:
        job = await store.get(job_id, lock=lock)
        if job is None or job.tenant_id != caller.tenant_id:  # never reveal other tenants' jobs
            raise not_found(f"No fine-tuning job found with id {job_id!r}", code="job_not_found",
                            param="fine_tuning_job_id")
        return job

    async def views(store: JobStore, jobs: list[Job]) -> list[FineTuningJob]:
        out = []
        for job in jobs:
            queue = rt.ctx.forecasts.get(job.job_id)
            if queue is None and job.status == rules.QUEUED:   # queued since the loop's last forecast
                queue = Forecast(await store.queue_position(job.sort_key, job.job_id), None)
            out.append(job_view(job, queue))
        return out

    @r.post("/jobs")
    async def create(body: CreateJob, caller: Caller = require("write"),
                     idempotency_key: str | None = Header(default=None),
                     x_trace_id: str | None = Header(default=None)) -> FineTuningJob:
        if x_trace_id is not None and not TRACE_ID.fullmatch(x_trace_id):
            raise ApiError(400, "X-Trace-Id must be 1-128 characters of A-Z a-z 0-9 . _ : -",
                           code="invalid_trace_id", param="X-Trace-Id")
        # no key: every call is a new job (as OpenAI's API); a key: Stripe's semantics
        key = body.idempotency_key or idempotency_key or f"auto-{uuid.uuid4().hex}"
        body, template = await templates.resolve(rt, caller.tenant_id, body)
        req = to_request(body, job_id_for(caller.tenant_id, key), key, rt.ctx.graders,
                         mlflow_configured=rt.ctx.config.mlflow_tracking_uri is not None)
        try:
            async with rt.uow() as uow:
                store = JobStore(uow, notify=False)   # committed below: this process's loop is woken directly
                job, _created = await submit_job(rt, store, caller.tenant_id, req, x_trace_id, body.metadata,
                                                 template=template)
                view = (await views(store, [job]))[0]
            if rt.ctx.config.cycle_in_request:   # the bench's baseline only
                await run_cycle(rt)
            elif store.woke:
                rt.ctx.loop.wake()
            return view
        except Rejected as exc:
            rt.ctx.metrics.rejected.labels(code=exc.code).inc()
            raise rejected(exc) from exc
        except IdempotencyConflict as exc:
            raise ApiError(409, str(exc), code="idempotency_conflict", param="Idempotency-Key") from exc

    @r.get("/jobs")
    async def list_jobs(caller: Caller = require("read"), after: str | None = None,
                        limit: int = Query(20, ge=1, le=100)) -> ListPage[FineTuningJob]:
        async with rt.uow() as uow:
            store = JobStore(uow)
            jobs, more = await store.page(caller.tenant_id, after, limit)
            data = await views(store, jobs)
        return list_page(data, more)

    @r.get("/jobs/{job_id}")
    async def get(job_id: str, caller: Caller = require("read")) -> FineTuningJob:
        async with rt.uow() as uow:
            store = JobStore(uow)
            return (await views(store, [await owned(store, job_id, caller)]))[0]

    @r.post("/jobs/{job_id}/cancel")
    async def cancel(job_id: str, caller: Caller = require("write")) -> FineTuningJob:
        async with rt.uow() as uow:
            store = JobStore(uow)
            job = await owned(store, job_id, caller, lock=True)
            if job.terminal:   # cancel wins in every state before succeeded, evaluating included
                raise ApiError(409, f"job {job_id} is {job.status} and can no longer be cancelled",
                               code="not_cancellable", param="fine_tuning_job_id")
            await cancel_job(rt, store, job)
            return (await views(store, [job]))[0]

    @r.post("/jobs/{job_id}/pause")
    async def pause(job_id: str, caller: Caller = require("write")) -> FineTuningJob:
        """OpenAI's pause, for every method: answers the job, `paused` (a running job's node is still
        writing its emergency checkpoint while `state` is not yet `paused`)."""
        async with rt.uow() as uow:
            store = JobStore(uow)
            job = await owned(store, job_id, caller, lock=True)
            try:
                await pause_job(rt, store, job)
            except PauseConflict as exc:
                raise ApiError(409, str(exc), code="not_pausable", param="fine_tuning_job_id") from exc
            return (await views(store, [job]))[0]

    @r.post("/jobs/{job_id}/resume")
    async def resume(job_id: str, caller: Caller = require("write")) -> FineTuningJob:
        """OpenAI's resume: a paused job is queued again and resumes from its latest checkpoint."""
        async with rt.uow() as uow:
            store = JobStore(uow)
            job = await owned(store, job_id, caller, lock=True)
            try:
                refused = await resume_job(rt, store, job)
            except PauseConflict as exc:   # still pausing: the SDK's retry may find it paused
                raise ApiError(409, str(exc), code="not_resumable", param="fine_tuning_job_id",
                               retry=job.pausing, headers={"Retry-After": "2"} if job.pausing else None) from exc
            if refused is not None:
                raise ApiError(429, refused.message, type="rate_limit_error", code=refused.code, retry=False)
            return (await views(store, [job]))[0]

    @r.get("/jobs/{job_id}/events", response_model=ListObject[EventObject])
    async def events(job_id: str, caller: Caller = require("read"), after: str | None = None,
                     limit: int = Query(20, ge=1, le=500), stream: bool = False):
        cursor = parse_event_id(after)
        async with rt.uow() as uow:
            store = JobStore(uow)
            await owned(store, job_id, caller)
            if not stream:
                rows = await store.events(job_id, cursor, limit + 1)
        if stream:
            return StreamingResponse(live_events(job_id, cursor or 0), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        data = [event_view(x) for x in rows[:limit]]
        return list_object(data, len(rows) > limit)

    async def live_events(job_id: str, last: int) -> AsyncIterator[str]:
        """Server-sent events, oldest first, until the job is over and everything was sent. Between
        looks it sleeps until a transaction that changed the job's events commits (NOTIFY)."""
        async with wakes.watch(job_id) as changed:
            while True:
                changed.clear()   # before the look: a change committed during it wakes the next one
                async with rt.uow() as uow:
                    store = JobStore(uow)
                    rows = await store.events(job_id, last, 200, newest_first=False)
                    job = await store.get(job_id)
                for entry in rows:
                    last = entry.id
                    yield f"data: {json.dumps(event_view(entry).model_dump(), default=str)}\n\n"
                if job is None or (job.terminal and not rows):
                    yield "data: [DONE]\n\n"
                    return
                if not rows:
                    await wakes.wait(changed)

    @r.get("/jobs/{job_id}/checkpoints")
    async def checkpoints(job_id: str, caller: Caller = require("read"), after: str | None = None,
                          limit: int = Query(10, ge=1, le=100)) -> ListPage[CheckpointObject]:
        async with rt.uow() as uow:
            store = JobStore(uow)
            job = await owned(store, job_id, caller)
            rows, more = await store.checkpoints(job_id, after, limit)
        data = [checkpoint_view(job, x) for x in rows]
        return list_page(data, more)

    return r
