"""Per-delivery trace records: what this service's consumer did with each event, and when.

For every event a handler finished (or dead-lettered) the runtime keeps one row in the service's own
`handled` table: the event's ids (event, trace, job), its producer and production time, when this
consumer started on it and how long the handler took. `GET /internal/trace?job_id=…|trace_id=…`
answers with this service's rows; `whet jobs trace JOB` joins the answers of every service with the
events it reads from Kafka. No service ever reads another's tables.

Recording is off the hot path: a row is appended to an in-memory buffer and a background task
writes the buffer with one COPY every `flush_s`. The rows are an operator's view, not state: if the
database is unreachable the buffer keeps at most `max_buffered` rows (the oldest are dropped and
counted) rather than slowing a handler down.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Query
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel

from .errors import ApiError
from .identity import Caller, require_or_internal
from .logging import get_logger

log = get_logger("whetstone.tracing")

COLUMNS = ("consumer", "event_id", "topic", "event_type", "tenant_id", "trace_id", "job_id", "producer",
           "produced_at", "started_at", "handler_s", "outcome")
MAX_ROWS = 2000
_ID_LIMIT = 200


class TraceLog:
    def __init__(self, consumer: str, registry: CollectorRegistry | None = None, service: str = "",
                 flush_s: float = 0.5, max_buffered: int = 20_000) -> None:
        self.consumer, self.flush_s, self.max_buffered = consumer, flush_s, max_buffered
        self.pool: Any = None
        self._rows: list[tuple[object, ...]] = []
        self._lock = asyncio.Lock()
        self._dropped = Counter("whetstone_trace_rows_dropped_total", "Trace rows dropped (database unreachable)",
                                ["service"], registry=registry).labels(service=service)

    def record(self, topic: str, envelope: Any, event: Any, started: float, handler_s: float, outcome: str) -> None:
        """One delivery finished. `started` is the wall-clock time (time.time()) the consumer began on it."""
        self.record_many([(topic, envelope, event, str(envelope.event_id))], started, handler_s, outcome)

    def record_many(self, deliveries: Sequence[tuple[str, Any, Any, str]], started: float, handler_s: float,
                    outcome: str) -> None:
        """Deliveries (topic, envelope, event, event_id as text) that began and finished together (a batch)."""
        at, seconds, consumer = datetime.fromtimestamp(started, UTC), max(handler_s, 0.0), self.consumer
        rows = self._rows
        for topic, envelope, event, event_id in deliveries:
            job_id = getattr(event, "job_id", None) if event is not None else None
            rows.append((consumer, event_id, topic, envelope.event_type, envelope.tenant_id, envelope.trace_id,
                         str(job_id) if job_id else None, envelope.producer, envelope.occurred_at, at, seconds,
                         outcome))
        if len(rows) > self.max_buffered:
            drop = len(rows) - self.max_buffered
            del rows[:drop]
            self._dropped.inc(drop)

    async def flush(self) -> int:
        async with self._lock:
            rows, self._rows = self._rows, []
            if not rows or self.pool is None:
                self._rows[:0] = rows
                return 0
            try:
                async with self.pool.acquire() as conn:
                    await conn.copy_records_to_table("handled", records=rows, columns=COLUMNS)
            except BaseException:
                self._rows[:0] = rows  # kept for the next flush (bounded by record())
                raise
            return len(rows)

    async def run(self) -> None:
        backoff = self.flush_s
        while True:
            await asyncio.sleep(backoff)
            try:
                await self.flush()
                backoff = self.flush_s
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("trace rows not written; retrying", error=str(exc)[:300], buffered=len(self._rows))
                backoff = min(backoff * 2, 30.0)

    async def query(self, *, job_id: str | None, trace_id: str | None, tenant_id: str | None,
                    limit: int = MAX_ROWS) -> list[Delivery]:
        await self.flush()
        rows = await self.pool.fetch(
            "SELECT event_id, topic, event_type, tenant_id, trace_id, job_id, producer, produced_at, started_at,"
            " handler_s, outcome FROM handled WHERE (job_id = $1 OR trace_id = $2)"
            " AND ($3::text IS NULL OR tenant_id = $3) ORDER BY started_at, produced_at, event_id LIMIT $4",
            job_id, trace_id, tenant_id, limit)
        return [Delivery.of(self.consumer, HandledRow.model_validate(dict(r))) for r in rows]


class HandledRow(BaseModel):
    """A row of the `handled` table (db.py)."""

    event_id: str
    topic: str
    event_type: str
    tenant_id: str
    trace_id: str | None
    job_id: str | None
    producer: str | None
    produced_at: datetime | None
    started_at: datetime
    handler_s: float
    outcome: str


class Delivery(BaseModel):
    """One delivery a consumer of this service handled (or dead-lettered), as `whet jobs trace` reads it."""

    consumer: str
    event_id: str
    topic: str
    event_type: str
    tenant_id: str
    trace_id: str | None
    job_id: str | None
    producer: str | None
    produced_at: str | None
    consumed_at: str
    handled_at: str
    lag_s: float | None
    handler_s: float
    outcome: str

    @classmethod
    def of(cls, consumer: str, r: HandledRow) -> Delivery:
        produced, started = r.produced_at, r.started_at
        return cls(consumer=consumer, event_id=r.event_id, topic=r.topic, event_type=r.event_type,
                   tenant_id=r.tenant_id, trace_id=r.trace_id, job_id=r.job_id, producer=r.producer,
                   produced_at=produced.isoformat() if produced else None, consumed_at=started.isoformat(),
                   handled_at=(started + timedelta(seconds=r.handler_s)).isoformat(),
                   lag_s=round((started - produced).total_seconds(), 6) if produced else None,
                   handler_s=round(r.handler_s, 6), outcome=r.outcome)


class Trace(BaseModel):
    object: Literal["list"] = "list"
    service: str
    consumer: str
    data: list[Delivery]
    query_s: float


def trace_routes(service: str, trace: TraceLog) -> APIRouter:
    router = APIRouter()

    @router.get("/internal/trace")
    async def internal_trace(job_id: str | None = Query(default=None, max_length=_ID_LIMIT),
                             trace_id: str | None = Query(default=None, max_length=_ID_LIMIT),
                             limit: int = Query(default=MAX_ROWS, ge=1, le=MAX_ROWS),
                             caller: Caller = require_or_internal("admin")) -> Trace:
        """This service's deliveries of the events of one job (by job_id) or trace (by trace_id)."""
        if not job_id and not trace_id:
            raise ApiError(400, "Give `job_id` or `trace_id` (or both).", param="job_id", code="missing_parameter")
        started = time.perf_counter()
        data = await trace.query(job_id=job_id, trace_id=trace_id,
                                 tenant_id=None if caller.platform else caller.tenant_id, limit=limit)
        return Trace(service=service, consumer=trace.consumer, data=data,
                     query_s=round(time.perf_counter() - started, 4))

    return router
