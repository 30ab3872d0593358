"""The per-message path, one fetch at a time: each message in its own transaction, the bookkeeping
once per fetch.

A service without a batch handler is consumed in fetches of up to `Service.fetch_records` records.
For each fetch:

- every record is decoded once (an undecodable one goes to `Runtime.handle_message`, which
  dead-letters it);
- ONE round trip counts this delivery of the fetch, by the first offset of each partition in it
  (committed at once, outside any handler transaction: a crash cannot roll it back), and asks the
  inbox which of its events this consumer has handled already;
- the messages are handled in order, each in its own unit of work (inbox claim and tenant check in
  one statement, handler, outbox), on one connection the fetch holds (a handler's
  own `rt.uow()` still takes another from the pool); a duplicate skips its transaction;
- the caller commits the offsets once, after the whole fetch; messages not reached within
  `Service.fetch_budget_s` are handed back (their partitions rewound to them) and come in the
  next fetch, so a slow handler never holds the consumer from polling for long.

Crash guarantee. Offsets are committed only after a fetch is handled, so after a crash the fetch
comes again from the same first offsets and its count says it was delivered before. Such a fetch
is handled carefully: each record's delivery is counted on its own before its handler runs (as
every record was before), plus the one uncounted delivery of the fetch's first run, and a record
handed out more than `max_crash_deliveries` times is dead-lettered. Records handled before the
crash are in the inbox and are skipped.

Lag is measured once per fetch (`FetchLag`); within a fetch it is that figure less what was handled.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka import TopicPartition

from whetstone.contracts import Envelope, Event

from . import db
from .messaging import decode, parse_payload

if TYPE_CHECKING:
    from .service import Handler, Runtime

# the deliveries counter of fetches, beside the per-record one (the consumer's name) and batches' (#batch)
FETCH_COUNTER = "#fetch"
# the connection a fetch holds while its messages are handled (in the consuming task's context only)
held_connection: contextvars.ContextVar[Any] = contextvars.ContextVar("held_connection", default=None)


@dataclass
class Fetched:
    """One record of a fetch, decoded (envelope and event None when it does not decode)."""

    record: Any
    envelope: Envelope | None
    event: Event | None

    @property
    def event_id(self) -> str | None:
        return str(self.envelope.event_id) if self.envelope is not None else None


def decode_fetch(routes: dict[str, tuple[type[Event], Handler]], records: Sequence[Any]) -> list[Fetched]:
    out = []
    for rec in records:
        try:
            env = decode(rec.value)
            out.append(Fetched(rec, env, parse_payload(env, routes[rec.topic][0])))
        except Exception:  # tombstones and garbage: the per-record path dead-letters them with the reason
            out.append(Fetched(rec, None, None))
    return out


def first_offsets(records: Sequence[Any]) -> list[tuple[str, int, int]]:
    firsts: dict[tuple[str, int], int] = {}
    for rec in records:
        tp = (rec.topic, rec.partition)
        firsts[tp] = min(firsts.get(tp, rec.offset), rec.offset)
    return [(t, p, o) for (t, p), o in firsts.items()]


async def consume_fetch(rt: Runtime[Any], routes: dict[str, tuple[type[Event], Handler]], records: Sequence[Any],
                        consumer: Any, taken: dict[tuple[str, int], int]) -> None:
    """Handle one fetch on the per-message path (see the module docstring). `taken` counts the records
    of each partition not handled yet (the runtime's in-flight figure); handled ones are taken off it."""
    started = time.monotonic()
    fetched = decode_fetch(routes, records)
    assert rt.pool is not None
    async with rt.pool.acquire() as conn:  # the fetch's messages' transactions run on it, one after another
        token = held_connection.set(conn)
        try:
            await _consume(rt, routes, fetched, consumer, taken, conn, started)
        finally:
            held_connection.reset(token)


async def _consume(rt: Runtime[Any], routes: dict[str, tuple[type[Event], Handler]], fetched: list[Fetched], consumer: Any,
                   taken: dict[tuple[str, int], int], conn: Any, started: float) -> None:
    deliveries, seen = await db.count_fetch(conn, rt.consumer, rt.consumer + FETCH_COUNTER,
                                            first_offsets([f.record for f in fetched]),
                                            [f.event_id for f in fetched if f.event_id is not None])
    careful = deliveries > 1
    if careful:
        rt.log.warning("fetch was delivered before and never finished; counting its records one by one",
                       size=len(fetched), deliveries=deliveries)
    for i, f in enumerate(fetched):
        if i and time.monotonic() - started > rt.service.fetch_budget_s:
            hand_back(consumer, [g.record for g in fetched[i:]])
            rt.log.info("fetch handed back unfinished: its time budget is spent", handled=i, left=len(fetched) - i)
            return
        rec = f.record
        model, handler = routes[rec.topic]
        key = rec.key.decode(errors="replace") if rec.key else None
        if f.envelope is None or f.event is None or careful:
            await rt.handle_message(rec.topic, model, handler, rec.value, rec.partition, rec.offset, key,
                                    uncounted=1 if careful else 0)
        else:
            await rt.handle_message(rec.topic, model, handler, rec.value, rec.partition, rec.offset, key,
                                    decoded=(f.envelope, f.event), seen=f.event_id in seen)
        tp = (rec.topic, rec.partition)
        taken[tp] -= 1
        rt.in_flight[tp] -= 1


def hand_back(consumer: Any, records: Sequence[Any]) -> None:
    """Rewind each partition to its first record not handled: the fetch's commit then stops there and
    the next fetch brings them again."""
    for topic, partition, offset in first_offsets(records):
        consumer.seek(TopicPartition(topic, partition), offset)


@dataclass
class FetchLag:
    """Messages not handled yet per assigned partition, measured once per fetch.

    `measure` asks the consumer: the high watermark of its last fetch minus its position, plus
    the records fetched but still waiting for a handler (`in_flight`). While a fetch is being
    handled, `current` answers from that measurement and the live in-flight counts, with no
    call into the consumer."""

    in_flight: dict[tuple[str, int], int] = field(default_factory=dict)
    unfetched: dict[tuple[str, int], int] | None = None  # at the last measurement; -1: not fetched yet
    handling: bool = False  # a fetch is being handled: its measurement stands

    async def measure(self, consumer: Any) -> dict[tuple[str, int], int] | None:
        assigned = consumer.assignment() if consumer is not None else set()
        if not assigned:
            self.unfetched = None
            return None
        unfetched = {}
        for tp in assigned:
            highwater = consumer.highwater(tp)
            unfetched[(tp.topic, tp.partition)] = -1 if highwater is None else max(
                highwater - await consumer.position(tp), 0)
        self.unfetched = unfetched
        return self.current()

    def current(self) -> dict[tuple[str, int], int] | None:
        if self.unfetched is None:
            return None
        return {tp: n if n < 0 else n + self.in_flight.get(tp, 0) for tp, n in self.unfetched.items()}
