"""Batch consumption: many messages in one transaction, with the per-message guarantees.

A service that sets `Service.batch_handler` is consumed in batches of up to
`Service.batch_size` records. For each batch:

- every record is decoded; an undecodable one goes through the per-message path,
  which dead-letters it (it does not block the others);
- copies of one event_id inside the batch are collapsed to the first;
- ONE transaction claims all event_ids in the inbox with a multi-row insert and
  hands the batch handler only the events this consumer has never seen;
- if that transaction fails for any reason, every message of the batch is
  handled again one by one through the service's per-topic handlers (retries,
  then `<topic>.dlq`), so one bad message costs the others nothing: those
  already handled are duplicates for the inbox;
- the Kafka offsets are committed by the caller only after all of this returned.

The batch handler must have the same effect as running the per-topic handlers on
the same messages one at a time.
"""

from __future__ import annotations

import asyncio
import functools
import time
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import asyncpg

from whetstone.contracts import Envelope, Event

from . import db
from .messaging import UnitOfWork, decode, parse_payload

if TYPE_CHECKING:
    from .service import Handler, Runtime


@dataclass(frozen=True)
class Delivery:
    """One decoded, never-seen message handed to a batch handler."""

    topic: str
    envelope: Envelope
    event: Event
    raw: bytes = b""  # the message as received
    partition: int = 0

    @functools.cached_property
    def event_id(self) -> str:
        """The envelope's event_id as text, made once (the inbox, the handler and the trace all need it)."""
        return str(self.envelope.event_id)


BatchHandler = Callable[["Runtime[Any]", UnitOfWork, list[Delivery]], Awaitable[None]]


async def claim_inbox_many(conn: asyncpg.Connection, consumer: str, deliveries: Sequence[Delivery]) -> set[str]:
    """The event_ids this consumer sees for the first time (inside the caller's transaction)."""
    rows = await conn.fetch(
        "INSERT INTO inbox (consumer, message_id, topic) SELECT $1, m, t FROM unnest($2::text[], $3::text[]) AS u(m, t)"
        " ON CONFLICT DO NOTHING RETURNING message_id",
        consumer, [d.event_id for d in deliveries], [d.topic for d in deliveries])
    return {r["message_id"] for r in rows}


def undecoded(message: Any) -> None:
    """FastStream decoder for batch subscribers: `consume_batch` decodes the records itself."""
    return None


async def _crashed_before(rt: Runtime[Any], records: Sequence[Any]) -> bool:
    """Count this delivery of the batch (by the first offset of each partition in it). A batch
    seen more than `max_attempts` times killed the process before: its records then go one by one
    through the per-message path, which counts each record and dead-letters the one that crashes."""
    firsts: dict[tuple[str, int], int] = {}
    for rec in records:
        tp = (rec.topic, rec.partition)
        firsts[tp] = min(firsts.get(tp, rec.offset), rec.offset)
    assert rt.pool is not None
    worst = await db.count_deliveries(rt.pool, rt.consumer + "#batch", [(t, p, o) for (t, p), o in firsts.items()])
    return worst > rt.settings.max_attempts


def _key(record: Any) -> str | None:
    return record.key.decode(errors="replace") if record.key else None


async def consume_batch(rt: Runtime[Any], routes: dict[str, tuple[type[Event], Handler]], records: Sequence[Any]) -> None:
    """Handle a batch of aiokafka ConsumerRecords (see the module docstring).

    With `Service.batch_concurrency` > 1 the batch is split by record key into that many
    shards, each handled in its own transaction concurrently: one shard's Python work
    overlaps the other's database round trips. Records with one key stay in one shard,
    in order. Offsets are committed by the caller after every shard has finished."""
    if await _crashed_before(rt, records):
        rt.log.warning("batch was delivered before and never finished; handling its messages one by one",
                       size=len(records))
        for rec in records:
            model, handler = routes[rec.topic]
            await rt.handle_message(rec.topic, model, handler, rec.value, rec.partition, rec.offset, _key(rec))
        return
    decoded: list[tuple[Any, Delivery]] = []
    for rec in records:
        model, handler = routes[rec.topic]
        try:
            env = decode(rec.value)
            decoded.append((rec, Delivery(rec.topic, env, parse_payload(env, model), rec.value, rec.partition)))
        except Exception:  # the per-message path dead-letters it with the reason
            await rt.handle_message(rec.topic, model, handler, rec.value, rec.partition, rec.offset, _key(rec))
    n = max(1, rt.service.batch_concurrency)
    shards: list[list[tuple[Any, Delivery]]] = [[] for _ in range(n)]
    for item in decoded:
        shards[zlib.crc32(item[0].key or b"") % n].append(item)
    results = await asyncio.gather(*(_consume_shard(rt, routes, shard) for shard in shards if shard),
                                   return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def _consume_shard(rt: Runtime[Any], routes: dict[str, tuple[type[Event], Handler]],
                         decoded: list[tuple[Any, Delivery]]) -> None:
    assert rt.service.batch_handler is not None
    start, began = time.perf_counter(), time.time()
    unique: dict[str, Delivery] = {}
    for _, d in decoded:
        unique.setdefault(d.event_id, d)
    try:
        fresh: list[Delivery] = []
        async with rt.uow() as uow:
            claimed = await claim_inbox_many(uow.conn, rt.consumer, list(unique.values()))
            fresh = [d for eid, d in unique.items() if eid in claimed]
            if fresh:
                await rt.service.batch_handler(rt, uow, fresh)
    except Exception as exc:
        rt.log.warning("batch failed; handling its messages one by one", size=len(decoded),
                       error=f"{type(exc).__name__}: {exc}")
        for rec, d in decoded:
            model, handler = routes[rec.topic]
            await rt.handle_message(rec.topic, model, handler, rec.value, rec.partition, rec.offset, _key(rec))
        return
    elapsed = time.perf_counter() - start
    _count(rt, decoded, fresh, elapsed)
    # each event of the batch waited for the whole transaction
    rt.trace.record_many([(d.topic, d.envelope, d.event, d.event_id) for d in fresh], began, elapsed, "handled")


def _count(rt: Runtime[Any], decoded: list[tuple[Any, Delivery]], fresh: list[Delivery], elapsed: float) -> None:
    handled: dict[str, int] = {}
    total: dict[str, int] = {}
    for d in fresh:
        handled[d.topic] = handled.get(d.topic, 0) + 1
    for _, d in decoded:
        total[d.topic] = total.get(d.topic, 0) + 1
    for topic, n in total.items():
        done = handled.get(topic, 0)
        if done:
            rt.metrics.consumed(topic=topic, outcome="handled").inc(done)
            observe_many(rt.metrics.handler_seconds(topic=topic), elapsed, done)
        if n - done:
            rt.metrics.consumed(topic=topic, outcome="duplicate").inc(n - done)


def observe_many(histogram: Any, amount: float, n: int) -> None:
    """`histogram.observe(amount)` n times, in one step: every event of a batch waited as long as the
    batch (the same buckets and sum as n observations; prometheus_client's Histogram internals)."""
    histogram._raise_if_not_observable()
    histogram._sum.inc(amount * n)
    for i, bound in enumerate(histogram._upper_bounds):
        if amount <= bound:
            histogram._buckets[i].inc(n)
            break
