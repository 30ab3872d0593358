"""Envelopes on the wire, the unit of work with its outbox, and the outbox relay."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg
import orjson

from whetstone.contracts import TOLERANT, Envelope, Event, topic_for
from whetstone.contracts.base import new_trace_id

from .delivery import unavailable_dependency
from .logging import get_logger

log = get_logger("whetstone.outbox")

E = TypeVar("E", bound=Event)

# The envelope being handled: published events inherit its trace_id.
current_envelope: contextvars.ContextVar[Envelope | None] = contextvars.ContextVar("current_envelope", default=None)


def make_envelope(event: Event, *, producer: str, tenant_id: str, trace_id: str | None = None,
                  key: str | None = None) -> Envelope:
    if key is None:
        key = str(getattr(event, topic_for(event).key_field))
    return envelope_of(type(event), event.model_dump(mode="json"), producer=producer, tenant_id=tenant_id,
                       key=key, trace_id=trace_id)


def envelope_of(event_class: type[Event], payload: dict[str, Any], *, producer: str, tenant_id: str, key: str,
                trace_id: str | None = None) -> Envelope:
    """An envelope around a payload already in the event's JSON form (a hot path that builds many of
    them skips the model's validation; its own test holds the payload to the contract). Without a
    trace id, the one of the message being handled, else a new one."""
    parent = current_envelope.get()
    return Envelope(
        event_type=event_class.EVENT_TYPE,
        schema_version=event_class.SCHEMA_VERSION,
        producer=producer,
        tenant_id=tenant_id,
        trace_id=trace_id or (parent.trace_id if parent else None) or new_trace_id(),
        key=key,
        payload=payload,
    )


def encode(envelope: Envelope) -> bytes:
    return envelope.model_dump_json().encode()


def decode(raw: bytes) -> Envelope:
    """Tolerant parse of a message; raises ValueError/ValidationError on garbage."""
    try:
        data = orjson.loads(raw)  # strict RFC 8259 (no NaN), and about 3x faster than json
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"invalid JSON: {exc}") from exc
    return Envelope.model_validate(data, context=TOLERANT)


def parse_payload(envelope: Envelope, model: type[E]) -> E:
    if envelope.event_type != model.EVENT_TYPE:
        raise ValueError(f"expected event_type {model.EVENT_TYPE!r}, got {envelope.event_type!r}")
    if envelope.schema_version > model.SCHEMA_VERSION:
        raise ValueError(f"{model.EVENT_TYPE} schema_version {envelope.schema_version} is newer than "
                         f"this consumer understands ({model.SCHEMA_VERSION})")
    return model.model_validate(envelope.payload, context=TOLERANT)


@dataclass(frozen=True)
class Published:
    """An event a unit of work published: its envelope, and the typed event where the producer
    handed one over (`publish`; `publish_many` takes ready-made envelopes)."""

    envelope: Envelope
    event: Event | None = None

    def read(self, model: type[E]) -> E:
        """The event as `model`: the producer's own instance, else parsed from the envelope."""
        if isinstance(self.event, model):
            return self.event
        return parse_payload(self.envelope, model)


@dataclass
class UnitOfWork:
    """One Postgres transaction; events published through it go to the outbox table
    in that same transaction and reach Kafka only after it commits."""

    conn: asyncpg.Connection
    producer: str
    pending: list[Published] = field(default_factory=list)
    committed: list[Callable[[], Any]] = field(default_factory=list)

    def after_commit(self, callback: Callable[[], Any]) -> None:
        """Run `callback` once the transaction has committed (never if it rolls back): e.g. wake a
        worker that must see the rows this unit of work wrote."""
        self.committed.append(callback)

    async def publish(self, event: Event, *, tenant_id: str, trace_id: str | None = None,
                      topic: str | None = None, key: str | None = None) -> Envelope:
        env = make_envelope(event, producer=self.producer, tenant_id=tenant_id, trace_id=trace_id, key=key)
        await self.conn.execute(
            "INSERT INTO outbox (topic, key, value) VALUES ($1, $2, $3)",
            topic or topic_for(event).name, env.key, encode(env),
        )
        self.pending.append(Published(env, event))
        return env

    async def publish_many(self, envelopes: Sequence[Envelope], *, topic: str) -> None:
        """Many ready-made envelopes to one topic in a single COPY into the outbox: the same
        table and relay as `publish`, for handlers that emit hundreds of events per transaction."""
        if not envelopes:
            return
        await self.conn.copy_records_to_table("outbox", records=[(topic, env.key, encode(env)) for env in envelopes],
                                              columns=("topic", "key", "value"))
        self.pending.extend(Published(env) for env in envelopes)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """An unsent row of the outbox table."""

    id: int
    topic: str
    key: str
    value: bytes
    attempts: int

    @classmethod
    def of(cls, row: asyncpg.Record) -> OutboxRow:
        return cls(id=row["id"], topic=row["topic"], key=row["key"], value=bytes(row["value"]),
                   attempts=row["attempts"])


class OutboxRelay:
    """Publishes committed outbox rows in id order and marks them sent.

    A broker outage delays events, never loses them; a crash between publish and
    mark re-publishes (at-least-once), which consumers absorb with their inbox.

    - One flush at a time per service schema (a transaction-scoped advisory lock): two replicas
      never publish disjoint batches in parallel, so events of one key keep their order.
    - Records are handed to the producer one after another (in id order) and acknowledged
      together; rows the broker acknowledged are marked sent even when others failed, so nothing
      acknowledged is published again.
    - A row the broker refuses for itself (larger than `max_record_bytes`, a permanent error, or
      failing `max_attempts` times while other rows went through) is quarantined with its error;
      the rows after it flow on. When every row fails it is an outage: nothing is counted.
    """

    def __init__(self, pool: asyncpg.Pool, send: Any, *, batch: int = 200, idle_poll_s: float = 0.5,
                 max_record_bytes: int = 1_000_000, max_attempts: int = 5, lock_key: int = 0) -> None:
        self.pool, self.send, self.batch, self.idle_poll_s = pool, send, batch, idle_poll_s
        self.max_record_bytes, self.max_attempts, self.lock_key = max_record_bytes, max_attempts, lock_key
        self.wakeup = asyncio.Event()
        self.published = 0
        self.quarantined = 0
        # called with what each committed unit of work published (the service's event metrics)
        self.on_committed: Callable[[Sequence[Published]], None] | None = None

    def poke(self) -> None:
        self.wakeup.set()

    async def flush_once(self) -> int:
        async with self.pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", self.lock_key):
                return 0  # another replica's relay is flushing; it publishes these rows in order
            rows = [OutboxRow.of(r) for r in await conn.fetch(
                "SELECT id, topic, key, value, attempts FROM outbox WHERE sent_at IS NULL AND quarantined_at IS NULL"
                " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED", self.batch)]
            if not rows:
                return 0
            sent, failed, refused = await self._publish(rows)
            if sent:
                await conn.execute("UPDATE outbox SET sent_at = now() WHERE id = ANY($1::bigint[])", sent)
            if failed and not sent and not refused:
                raise failed[0][1]  # an outage: every row failed alike; retry them all later
            for row, exc in failed:
                attempts = row.attempts + 1
                if attempts >= self.max_attempts:
                    refused.append((row, f"failed {attempts} times: {type(exc).__name__}: {exc}"))
                else:
                    await conn.execute("UPDATE outbox SET attempts = $2, last_error = $3 WHERE id = $1", row.id,
                                       attempts, f"{type(exc).__name__}: {exc}"[:2000])
            for row, error in refused:
                await conn.execute("UPDATE outbox SET quarantined_at = now(), attempts = attempts + 1,"
                                   " last_error = $2 WHERE id = $1", row.id, error[:2000])
                self.quarantined += 1
                log.error("outbox row quarantined: the broker will not take it", outbox_id=row.id,
                          topic=row.topic, key=row.key, bytes=len(row.value), error=error)
        self.published += len(sent)
        return len(rows)

    async def _publish(self, rows: Sequence[OutboxRow]) -> tuple[list[int], list[tuple[OutboxRow, BaseException]],
                                                                 list[tuple[OutboxRow, str]]]:
        refused: list[tuple[OutboxRow, str]] = []
        queued: list[tuple[OutboxRow, Any]] = []
        failed: list[tuple[OutboxRow, BaseException]] = []
        for r in rows:  # handed over in id order: the producer keeps that order per partition
            size = len(r.value) + len(r.key.encode())
            if size > self.max_record_bytes:
                refused.append((r, f"record of {size} bytes exceeds the producer's limit of {self.max_record_bytes}"))
                continue
            try:
                queued.append((r, await self.send(r.topic, r.key, r.value)))
            except Exception as exc:
                if _permanent(exc):
                    refused.append((r, f"{type(exc).__name__}: {exc}"))
                else:
                    failed.append((r, exc))
        results = await asyncio.gather(*(ack for _, ack in queued), return_exceptions=True)
        sent: list[int] = []
        for (r, _), result in zip(queued, results, strict=True):
            if not isinstance(result, BaseException):
                sent.append(r.id)
            elif _permanent(result):
                refused.append((r, f"{type(result).__name__}: {result}"))
            else:
                failed.append((r, result))
        return sent, failed, refused

    async def run(self) -> None:
        backoff = 0.2
        while True:
            try:
                n = await self.flush_once()
                backoff = 0.2
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # broker or database down: wait and retry, rows stay unsent
                log.warning("outbox relay failed; retrying", error=str(exc), retry_in_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            if n == 0:
                self.wakeup.clear()
                try:
                    await asyncio.wait_for(self.wakeup.wait(), timeout=self.idle_poll_s)
                except TimeoutError:
                    pass


def _permanent(exc: BaseException) -> bool:
    """Errors about the record itself, which no retry fixes."""
    from aiokafka import errors  # noqa: PLC0415

    permanent = (errors.MessageSizeTooLargeError, errors.RecordListTooLargeError, errors.InvalidTopicError,
                 errors.CorruptRecordException, errors.TopicAuthorizationFailedError)
    return isinstance(exc, permanent)


@asynccontextmanager
async def _transaction(conn: Any, producer: str) -> AsyncIterator[UnitOfWork]:
    try:
        async with conn.transaction():
            yield UnitOfWork(conn, producer)
    except BaseException as exc:
        if unavailable_dependency(exc) == "database":
            # a connection the server dropped (or left mid-message) never goes back to the pool; one
            # already closed was detached from its proxy, which then refuses every call
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.terminate()
        raise


@asynccontextmanager
async def unit_of_work(pool: asyncpg.Pool, producer: str, relay: OutboxRelay | None = None, *,
                       conn: Any = None) -> AsyncIterator[UnitOfWork]:
    """One transaction on a connection of `pool`, or on `conn` when the caller holds one (the
    per-message path holds one for a whole fetch)."""
    if conn is not None:
        async with _transaction(conn, producer) as uow:
            yield uow
    else:
        async with pool.acquire() as conn, _transaction(conn, producer) as uow:
            yield uow
    for callback in uow.committed:
        callback()
    if relay is not None and uow.pending:
        relay.poke()
        if relay.on_committed is not None:
            relay.on_committed(uow.pending)


async def publish_direct(bootstrap: str, event: Event, *, tenant_id: str, producer: str = "whet-cli",
                         trace_id: str | None = None, **client_options: Any) -> Envelope:
    """For external producers (CLI, tests): one envelope straight to Kafka, no outbox."""
    from aiokafka import AIOKafkaProducer  # noqa: PLC0415

    env = make_envelope(event, producer=producer, tenant_id=tenant_id, trace_id=trace_id)
    kafka = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **client_options)  # security: settings
    await kafka.start()
    try:
        await kafka.send_and_wait(topic_for(event).name, encode(env), key=env.key.encode())
    finally:
        await kafka.stop()
    return env
